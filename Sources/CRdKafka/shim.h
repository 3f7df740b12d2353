#ifndef APNS_FLEET_CRDKAFKA_SHIM_H
#define APNS_FLEET_CRDKAFKA_SHIM_H
// rdkafka_mock.h does not compile on its own: it needs rdkafka.h first.
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#endif
