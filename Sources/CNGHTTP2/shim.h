#ifndef APNS_FLEET_CNGHTTP2_SHIM_H
#define APNS_FLEET_CNGHTTP2_SHIM_H
#include <nghttp2/nghttp2.h>
#endif
