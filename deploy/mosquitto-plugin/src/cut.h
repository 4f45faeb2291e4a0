/* A moving session's identities and cuts (cut.c; docs/architecture.md §5, "Exactly once
 * across a move under traffic"). */
#ifndef MQFED_CUT_H
#define MQFED_CUT_H

#include "util.h"

struct move;

/* The old copy: what its session queues while its client is away, and the new node's cut. */
void cut_on_disconnect(const char *id);
void cut_on_connect(const char *id);
void cut_note_granted(const char *id, uint64_t origin, uint64_t seq);
bool cut_refuses(const char *id, uint64_t origin, uint64_t seq);
void cut_arrived(const char *id, uint64_t origin, uint64_t seq, int64_t sent_ms);
cJSON *cut_granted_json(const char *id);

/* The new copy (a live hold in cut mode): at its release, what the old copy had. */
struct move *move_find(const char *id);
struct move *move_open(const char *id);
void move_close(const char *id);
int move_set_skips(struct move *m, const cJSON *granted, const cJSON *cuts);
bool move_skips(const struct move *m, uint64_t origin, uint64_t seq);

void cut_tick(int64_t now_ms);
void cut_stats(cJSON *o);
void cut_count_skipped(void);
void cut_clear(void);
uint64_t cut_origin_hash(const char *node, size_t len);

#endif
