/* A moving session's cuts and identities (cut mode of hold.c; docs/architecture.md §5,
 * "Exactly once across a move under traffic"). */
#ifndef MQFED_CUT_H
#define MQFED_CUT_H

#include "util.h"

struct move;

struct move *move_find(const char *id);
struct move *move_open(const char *id, uint64_t cut_from);
void move_close(const char *id);
/* The old copy: whether a message of `origin` is the new copy's (at or above the new node's
 * cut, once it came). */
bool move_cut_refuses(const struct move *m, uint64_t origin, uint64_t seq);
/* The old copy: an injected message it granted (its identity), for the new copy to skip. */
void move_granted(struct move *m, uint64_t origin, uint64_t seq);
cJSON *move_granted_json(const struct move *m);
/* The new copy, at its release: what the old copy had. */
int move_set_skips(struct move *m, const cJSON *granted, const cJSON *cuts);
bool move_skips(const struct move *m, uint64_t origin, uint64_t seq);

/* A cut from a batch (kind 2 record): the old copy's of `id` if it waits for that origin's,
 * else it waits (for the old copy's `hold old`, at most CUT_PENDING_MS). */
void cut_arrived(const char *id, uint64_t origin, uint64_t seq);
void cut_tick(int64_t now_ms);
void cut_stats(cJSON *o);
void cut_count_refused(void);
void cut_count_skipped(void);
void cut_clear(void);
uint64_t cut_origin_hash(const char *node, size_t len);

#endif
