// jemalloc, linked into the apns-fleet executable as the process's malloc. Only mallctl is
// declared here: jemalloc.h would redeclare malloc and friends next to glibc's.
#include <stddef.h>

int mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen);
