/* The fuzz target (target.c): one input is a little program of broker events for the plugin;
 * seeds.c writes well-formed ones. */
#ifndef MQFED_FUZZ_TARGET_H
#define MQFED_FUZZ_TARGET_H

#include <stddef.h>
#include <stdint.h>

/* Operations of an input program (the byte before each operation, modulo OP_COUNT). */
enum fuzz_op {
	OP_CONNECT,        /* slot, id, username, password, flags, expiry */
	OP_DISCONNECT,     /* slot, keep session */
	OP_CONTROL,        /* slot, payload (a command on $CONTROL/mqfed/v1) */
	OP_ACL,            /* slot, access, topic, qos, retain, payload */
	OP_MESSAGE,        /* slot, topic, payload, qos, retain, properties */
	OP_TICK,
	OP_EXT_AUTH,       /* slot */
	OP_VERDICT,        /* what the rest of the ACL chain answers in defer mode */
	OP_INJECT,         /* slot, payload (an MQFB batch on $CONTROL/mqfed/inject) */
	OP_CAPTURE,        /* bytes from the sidecar on the capture socket (capture.c) */
	OP_COUNT
};

#define FUZZ_SLOTS 8

int mqfed_fuzz_one(const uint8_t *data, size_t size);

#endif
