#ifndef APNS_FLEET_MALLOC_SETTINGS_H
#define APNS_FLEET_MALLOC_SETTINGS_H

/// jemalloc's options for the apns-fleet executable (see malloc_settings.c).
extern const char *malloc_conf;

#endif
