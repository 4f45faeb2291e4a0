/* Fail-safe run-time calibration of where `session_expiry_interval` sits in struct mosquitto.
 *
 * The sidecar connects with the session expiry 1234567891. At its BASIC_AUTH callback the
 * plugin scans the client's own allocation (malloc_usable_size bytes, 4-byte steps, so the scan
 * never reads outside it) for that value. Exactly one hit fixes the offset; every later sidecar
 * connect must find the value at the same offset. Anything else makes the field unknown for
 * the rest of the run (one warning): v5 expiry is then reported as null. */
#include <malloc.h>
#include <string.h>

#include "calib.h"

#define CALIB_EXPIRY 1234567891u

enum calib_state { CALIB_PENDING = 0, CALIB_OK = 1, CALIB_UNKNOWN = 2 };

static enum calib_state calib;
static size_t calib_offset;

static void calib_fail(const char *why)
{
	if(calib != CALIB_UNKNOWN){
		mosquitto_log_printf(MOSQ_LOG_WARNING,
				"mqfed: session expiry calibration failed (%s): MQTT v5 session expiry is "
				"reported as unknown (null) from now on", why);
	}
	calib = CALIB_UNKNOWN;
}

/* True when this connect just fixed the offset: expiries unknown so far can be read now. */
bool calib_on_sidecar_auth(struct mosquitto *client)
{
	size_t size, off, hit = 0;
	unsigned hits = 0;
	const unsigned char *base = (const unsigned char *)client;

	if(calib == CALIB_UNKNOWN) return false;
	if(mosquitto_client_protocol_version(client) != 5){
		calib_fail("the sidecar did not connect with MQTT v5");
		return false;
	}
	size = malloc_usable_size(client);
	if(size < sizeof(uint32_t) || size > (1u << 20)){
		calib_fail("unexpected allocation size of the client structure");
		return false;
	}
	if(calib == CALIB_OK){
		uint32_t v;
		if(calib_offset + sizeof(v) > size){
			calib_fail("offset outside the client structure");
			return false;
		}
		memcpy(&v, base + calib_offset, sizeof(v));
		if(v != CALIB_EXPIRY){
			calib_fail("the value moved at a later sidecar connect");
		}
		return false;
	}
	for(off = 0; off + sizeof(uint32_t) <= size; off += 4){
		uint32_t v;
		memcpy(&v, base + off, sizeof(v));
		if(v == CALIB_EXPIRY){
			hits++;
			hit = off;
		}
	}
	if(hits == 1){
		calib = CALIB_OK;
		calib_offset = hit;
		return true;
	}
	if(hits == 0){
		calib_fail("the sidecar's session expiry 1234567891 was not found");
	}else{
		calib_fail("the calibration value was found more than once");
	}
	return false;
}

/* The session expiry interval Mosquitto holds for a live client structure right now.
 * v3.x: Mosquitto stores UINT32_MAX for clean session false, 0 otherwise (handle_connect.c),
 * which is known without calibration. v5: only with a calibrated offset. */
int64_t client_expiry(struct mosquitto *client)
{
	int proto = mosquitto_client_protocol_version(client);

	if(calib == CALIB_OK){
		uint32_t v;
		memcpy(&v, (const unsigned char *)client + calib_offset, sizeof(v));
		return (int64_t)v;
	}
	if(proto != 5){
		return mosquitto_client_clean_session(client) ? 0 : EXPIRY_NEVER;
	}
	return EXPIRY_UNKNOWN;
}

/* Where the session expiry interval sits in struct mosquitto, once calibrated. */
bool calib_expiry_offset(size_t *offset)
{
	if(calib != CALIB_OK) return false;
	*offset = calib_offset;
	return true;
}

const char *calib_name(void)
{
	switch(calib){
		case CALIB_OK: return "ok";
		case CALIB_UNKNOWN: return "unknown";
		default: return "pending";
	}
}

void calib_cleanup(void)
{
	calib = CALIB_PENDING;
	calib_offset = 0;
}
