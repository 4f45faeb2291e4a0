/* The node-local journal of QoS > 0 messages peers want, until peers have them (journal.c). */
#ifndef MQFED_JOURNAL_H
#define MQFED_JOURNAL_H

#include "util.h"

struct journal_stats {
	bool on;
	uint64_t live;             /* entries peers have not confirmed */
	uint64_t live_bytes;       /* their records' bytes in the file */
	uint64_t file_bytes;
	uint64_t written;          /* entries written */
	uint64_t trimmed;          /* entries confirmed (or routed to no peer) */
	uint64_t confirmations;    /* copies confirmed by the sidecar */
	uint64_t unmatched;        /* confirmations that matched no entry */
	uint64_t expired;          /* entries given up (journal_max_age, a QoS 2 never released) */
	uint64_t errors;           /* writes that failed (the message is not protected) */
	uint64_t compactions;
};

void journal_init(const char *dir, const char *epoch, uint64_t max_age_s);
void journal_on_message(const struct mosquitto_evt_message *ed);
void journal_fwd_read(const char *topic, const void *payload, uint32_t len);
void journal_confirm(const unsigned char *fps, size_t count);
void journal_tick(void);
void journal_stats(struct journal_stats *s);
void journal_cleanup(void);

#endif
