/*
 * The node-local journal: every QoS > 0 message peers want, written to a file before Mosquitto
 * acknowledges it, until the sidecar confirms that peers have it. A node killed (kill -9, OOM,
 * a crash) loses Mosquitto's memory, including the copies it still owed the forwarding
 * connection (.fwd); the restarted sidecar replays what this file still holds
 * (docs/architecture.md, "The journal").
 *
 * Facts of Mosquitto 2.0.11 it rests on (handle_publish.c): the MESSAGE callback of a client's
 * QoS 1 or 2 PUBLISH runs before db__message_store() and before its PUBACK (QoS 1: after
 * sub__messages_queue(), which routes it at once) or PUBREC (QoS 2: routed later, at its PUBREL,
 * by db__message_release_incoming()). Routing checks READ access once per copy it queues for a
 * subscriber (subs.c, subs__send), with the stored message's own topic and payload pointers,
 * which the MESSAGE callback saw too (origin.c explains why).
 *
 * Each entry is one record appended with one writev(2): no fsync, so it survives the process
 * being killed, not the machine (or its disk) failing. The entry counts the copies Mosquitto
 * routes to .fwd (READ checks of .fwd matched to it by those pointers: the message of the last
 * MESSAGE callback until the loop's tick, or a QoS 2 message by its topic pointer until its
 * PUBREL routing) and the copies the sidecar confirmed. The sidecar confirms a copy when every
 * peer it goes to has it (acked, or durable in the sidecar's spill: the moment it acks the copy
 * to Mosquitto), naming it by a fingerprint of its contents (CRC-32 of the topic, CRC-32 of
 * the payload): copies with the same fingerprint are interchangeable, so a confirmation settles
 * the oldest entry with that fingerprint still waiting for one. An entry whose copies are all
 * confirmed, or whose routing gave .fwd no copy, is trimmed (a trim record). The file is
 * rewritten with only the live entries when it grows past 4 MiB and four times their size, and
 * truncated when none is live.
 *
 * File `<journal_dir>/journal-<epoch>.bin`, locked (flock) while this Mosquitto runs: a file
 * nobody holds is a dead run's, which the sidecar replays and removes. Format, little endian:
 * "MQFJRNL1", then records. Message: 'M', qos, retain, 0, u32 topic length, u32 payload length,
 * u32 properties length, u64 seq, u64 fingerprint, i64 wall-clock ms, then topic, payload and
 * the properties as JSON (events' format). Trim: 'T', 0, 0, 0, u32 count, count u64 seqs.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/uio.h>
#include <unistd.h>

#include "journal.h"
#include "shed.h"

#define MAGIC "MQFJRNL1"
#define MAGIC_LEN 8
#define MSG_HEAD 40
#define TRIM_HEAD 8
#define TRIM_BATCH 4096
#define COMPACT_MIN_BYTES (4u << 20)
#define COPY_CHUNK (64u << 10)
#define Q2_MAX_AGE_MS 60000
#define SWEEP_MS 1000
#define ERROR_LOG_MS 10000

struct jentry {
	uint64_t seq;
	uint64_t fp;
	uint64_t off;              /* of its record in the file */
	uint64_t new_off;          /* in the file being written by a compaction */
	uint32_t len;              /* record bytes */
	uint32_t plen;             /* payload bytes (identity) */
	uint32_t copies;           /* routed to .fwd */
	uint32_t confirmed;
	bool routed;               /* its routing is over: `copies` is final */
	bool in_q2;                /* QoS 2 awaiting the routing at its PUBREL */
	bool hit;                  /* QoS 2: a READ check of its routing was seen */
	int64_t born_ms;           /* monotonic */
	const char *topic;         /* identity while its routing may run */
	const void *payload;
	struct jentry *prev, *next;     /* live entries, oldest first */
	struct jentry *fp_next;         /* same fingerprint, oldest first */
	struct jentry *next_hit;
	UT_hash_handle hh;         /* q2, keyed by the topic pointer */
};

struct fp_bucket {
	UT_hash_handle hh;         /* keyed by fp */
	uint64_t fp;
	struct jentry *head, *tail;
};

static int fd = -1;
static char *path;
static char *tmp_path;
static int64_t max_age_ms;
static uint64_t next_seq;
static uint64_t file_bytes;
static uint64_t live_bytes;
static uint64_t live_count;
static struct jentry *live_head, *live_tail;
static struct fp_bucket *buckets;
static struct jentry *q2;          /* QoS 2 entries awaiting their PUBREL routing */
static struct jentry *hits;        /* q2 entries whose routing ran: settled at the next tick */
static struct jentry *cur;         /* the QoS 1 entry of the last MESSAGE callback */
static uint64_t trims[TRIM_BATCH];
static size_t ntrims;
static int64_t last_sweep_ms;
static struct journal_stats st;
static struct ratelog error_log;
static uint32_t crc_table[256];

static void crc_init(void)
{
	uint32_t c, n, k;

	for(n = 0; n < 256; n++){
		c = n;
		for(k = 0; k < 8; k++){
			c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
		}
		crc_table[n] = c;
	}
}

/* CRC-32 (ISO-HDLC, zlib's crc32). */
static uint32_t crc32_of(const void *data, size_t len)
{
	const unsigned char *b = data;
	uint32_t c = 0xFFFFFFFFu;

	while(len--){
		c = crc_table[(c ^ *b++) & 0xFF] ^ (c >> 8);
	}
	return c ^ 0xFFFFFFFFu;
}

/* What the sidecar names a copy by: CRC-32 of the topic (high half), of the payload (low). */
static uint64_t fingerprint(const char *topic, size_t tlen, const void *payload, uint32_t plen)
{
	return ((uint64_t)crc32_of(topic, tlen) << 32) | crc32_of(payload, payload ? plen : 0);
}

static void put32(unsigned char *p, uint32_t v)
{
	int i;

	for(i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put64(unsigned char *p, uint64_t v)
{
	int i;

	for(i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get64(const unsigned char *p)
{
	uint64_t v = 0;
	int i;

	for(i = 7; i >= 0; i--) v = (v << 8) | p[i];
	return v;
}

static void log_error(const char *what)
{
	uint64_t held;

	st.errors++;
	if(ratelog_due(&error_log, ERROR_LOG_MS, &held)){
		mosquitto_log_printf(MOSQ_LOG_ERR, "mqfed: journal %s: %s %s (%llu errors so far): the "
				"messages concerned are not protected against this node being killed",
				path ? path : "", what, strerror(errno), (unsigned long long)st.errors);
	}
}

/* Write all of iov to `to` (O_APPEND); on failure cut the file back to `size` so that no
 * record is left half written. */
static bool write_all(int to, struct iovec *iov, int n, uint64_t size)
{
	ssize_t w;

	while(n > 0){
		w = writev(to, iov, n);
		if(w < 0){
			if(errno == EINTR) continue;
			if(ftruncate(to, (off_t)size)){ /* what can be done was done */ }
			return false;
		}
		while(n > 0 && (size_t)w >= iov->iov_len){
			w -= (ssize_t)iov->iov_len;
			iov++;
			n--;
		}
		if(n > 0){
			iov->iov_base = (char *)iov->iov_base + w;
			iov->iov_len -= (size_t)w;
		}
	}
	return true;
}

static void flush_trims(void)
{
	unsigned char head[TRIM_HEAD];
	unsigned char body[TRIM_BATCH * 8];
	struct iovec iov[2];
	size_t i;

	if(ntrims == 0 || fd < 0) return;
	memset(head, 0, sizeof(head));
	head[0] = 'T';
	put32(head + 4, (uint32_t)ntrims);
	for(i = 0; i < ntrims; i++) put64(body + 8 * i, trims[i]);
	iov[0] = (struct iovec){head, sizeof(head)};
	iov[1] = (struct iovec){body, 8 * ntrims};
	if(write_all(fd, iov, 2, file_bytes)){
		file_bytes += sizeof(head) + 8 * ntrims;
	}else{
		log_error("writing trim records failed:"); /* those entries are replayed: duplicates */
	}
	ntrims = 0;
}

static void bucket_remove(struct jentry *e)
{
	struct fp_bucket *b = NULL;
	struct jentry **pp, *prev = NULL;

	HASH_FIND(hh, buckets, &e->fp, sizeof(e->fp), b);
	if(b == NULL) return;
	for(pp = &b->head; *pp; prev = *pp, pp = &(*pp)->fp_next){
		if(*pp == e){
			*pp = e->fp_next;
			if(b->tail == e) b->tail = prev;
			break;
		}
	}
	if(b->head == NULL){
		HASH_DEL(buckets, b);
		free(b);
	}
}

static void hits_remove(struct jentry *e)
{
	struct jentry **pp;

	for(pp = &hits; *pp; pp = &(*pp)->next_hit){
		if(*pp == e){
			*pp = e->next_hit;
			return;
		}
	}
}

/* Forget an entry: its trim record goes out with the next batch. */
static void trim(struct jentry *e)
{
	if(e->in_q2){
		if(e->hit) hits_remove(e);
		HASH_DEL(q2, e);
	}
	if(cur == e) cur = NULL;
	if(e->prev) e->prev->next = e->next; else live_head = e->next;
	if(e->next) e->next->prev = e->prev; else live_tail = e->prev;
	bucket_remove(e);
	live_bytes -= e->len;
	live_count--;
	st.trimmed++;
	trims[ntrims++] = e->seq;
	free(e);
	if(ntrims == TRIM_BATCH) flush_trims();
}

static void maybe_trim(struct jentry *e)
{
	if(e->routed && e->confirmed >= e->copies) trim(e);
}

/* Routings that ran since the last call are over: their copy counts are final. */
static void settle(void)
{
	struct jentry *e;

	if(cur){
		e = cur;
		cur = NULL;
		e->routed = true;
		maybe_trim(e);
	}
	while(hits){
		e = hits;
		hits = e->next_hit;
		e->hit = false;
		e->in_q2 = false;
		HASH_DEL(q2, e);
		e->routed = true;
		maybe_trim(e);
	}
}

void journal_init(const char *dir, const char *epoch, uint64_t max_age_s)
{
	if(dir == NULL || dir[0] == '\0') return;
	crc_init();
	max_age_ms = (int64_t)max_age_s * 1000;
	if(asprintf(&path, "%s/journal-%s.bin", dir, epoch) < 0){
		path = NULL;
		return;
	}
	if(asprintf(&tmp_path, "%s.tmp", path) < 0){
		tmp_path = NULL;
		free(path);
		path = NULL;
		return;
	}
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
	if(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0 && write(fd, MAGIC, MAGIC_LEN) == MAGIC_LEN){
		file_bytes = MAGIC_LEN;
		st.on = true;
		mosquitto_log_printf(MOSQ_LOG_NOTICE, "mqfed: journal %s (entries older than %llu s "
				"are given up)", path, (unsigned long long)max_age_s);
		return;
	}
	mosquitto_log_printf(MOSQ_LOG_ERR, "mqfed: cannot open the journal %s: %s; QoS > 0 messages "
			"acknowledged but not yet forwarded are lost if this node is killed",
			path, strerror(errno));
	if(fd >= 0){
		close(fd);
		unlink(path);
	}
	fd = -1;
}

static void append(const struct mosquitto_evt_message *ed)
{
	cJSON *pj = NULL;
	char *props = NULL;
	size_t tlen = strlen(ed->topic), plen = 0;
	uint64_t total, fp;
	unsigned char head[MSG_HEAD];
	struct iovec iov[4];
	struct jentry *e;
	struct fp_bucket *b = NULL;

	if(ed->properties){
		pj = properties_to_json(ed->properties);
		props = pj ? cJSON_PrintUnformatted(pj) : NULL;
		cJSON_Delete(pj);
		if(props == NULL){
			errno = ENOMEM;
			log_error("encoding properties failed:");
			return;
		}
		plen = strlen(props);
	}
	total = MSG_HEAD + tlen + ed->payloadlen + plen;
	e = calloc(1, sizeof(*e));
	if(e == NULL || total > UINT32_MAX){
		errno = e ? EFBIG : ENOMEM;
		log_error("recording a message failed:");
		free(e);
		free(props);
		return;
	}
	fp = fingerprint(ed->topic, tlen, ed->payload, ed->payloadlen);
	memset(head, 0, sizeof(head));
	head[0] = 'M';
	head[1] = ed->qos;
	head[2] = ed->retain ? 1 : 0;
	put32(head + 4, (uint32_t)tlen);
	put32(head + 8, ed->payloadlen);
	put32(head + 12, (uint32_t)plen);
	put64(head + 16, next_seq + 1);
	put64(head + 24, fp);
	put64(head + 32, (uint64_t)now_ms());
	iov[0] = (struct iovec){head, sizeof(head)};
	iov[1] = (struct iovec){ed->topic, tlen};
	iov[2] = (struct iovec){ed->payload, ed->payload ? ed->payloadlen : 0};
	iov[3] = (struct iovec){props, plen};
	if(!write_all(fd, iov, 4, file_bytes)){
		log_error("writing failed:");
		free(e);
		free(props);
		return;
	}
	free(props);
	e->seq = ++next_seq;
	e->fp = fp;
	e->off = file_bytes;
	e->len = (uint32_t)total;
	e->plen = ed->payloadlen;
	e->born_ms = mono_ms();
	e->topic = ed->topic;
	e->payload = ed->payload;
	file_bytes += total;
	live_bytes += total;
	live_count++;
	st.written++;
	e->prev = live_tail;
	if(live_tail) live_tail->next = e; else live_head = e;
	live_tail = e;
	HASH_FIND(hh, buckets, &fp, sizeof(fp), b);
	if(b == NULL){
		b = calloc(1, sizeof(*b));
		if(b == NULL){ /* it stays live until its max age: replayed, never lost */
			return;
		}
		b->fp = fp;
		HASH_ADD(hh, buckets, fp, sizeof(b->fp), b);
	}
	if(b->tail) b->tail->fp_next = e; else b->head = e;
	b->tail = e;
	if(ed->qos == 1){
		cur = e;
	}else{
		e->in_q2 = true;
		HASH_ADD_PTR(q2, topic, e);
	}
}

/* The MESSAGE callback of a client's publish that Mosquitto will store and acknowledge. */
void journal_on_message(const struct mosquitto_evt_message *ed)
{
	struct jentry *e = NULL;

	if(fd < 0) return;
	settle();
	if(ed->topic == NULL) return;
	if(q2){
		/* a live message has this topic pointer: that entry's message was freed unrouted
		 * (a PUBLISH sent again with DUP, or a session that ended before its PUBREL) */
		HASH_FIND_PTR(q2, &ed->topic, e);
		if(e){
			e->in_q2 = false;
			HASH_DEL(q2, e);
			e->routed = true;
			maybe_trim(e);
		}
	}
	if(ed->qos == 0 || !shed_wanted(ed->topic)) return;
	append(ed);
}

/* A READ check of .fwd that queues it a copy (not the re-check of its session at CONNECT). */
void journal_fwd_read(const char *topic, const void *payload, uint32_t len)
{
	struct jentry *e = NULL;

	if(fd < 0 || topic == NULL) return;
	if(cur && cur->topic == topic && cur->payload == payload && cur->plen == len){
		cur->copies++;
		return;
	}
	if(q2 == NULL) return;
	HASH_FIND_PTR(q2, &topic, e);
	if(e && e->payload == payload && e->plen == len){
		e->copies++;
		if(!e->hit){
			e->hit = true;
			e->next_hit = hits;
			hits = e;
		}
	}
}

/* The sidecar confirms `count` copies (8-byte little-endian fingerprints). */
void journal_confirm(const unsigned char *fps, size_t count)
{
	struct fp_bucket *b;
	struct jentry *e;
	uint64_t fp;
	size_t i;

	if(fd < 0) return;
	for(i = 0; i < count; i++){
		fp = get64(fps + 8 * i);
		st.confirmations++;
		b = NULL;
		HASH_FIND(hh, buckets, &fp, sizeof(fp), b);
		for(e = b ? b->head : NULL; e; e = e->fp_next){
			if(e->confirmed < e->copies) break;
		}
		if(e == NULL){
			st.unmatched++;
			continue;
		}
		e->confirmed++;
		maybe_trim(e);
	}
}

static bool copy_range(int to, uint64_t off, uint64_t len, unsigned char *buf)
{
	struct iovec iov;
	ssize_t r;
	size_t n;

	while(len > 0){
		n = len < COPY_CHUNK ? (size_t)len : COPY_CHUNK;
		r = pread(fd, buf, n, (off_t)off);
		if(r <= 0){
			if(r < 0 && errno == EINTR) continue;
			if(r == 0) errno = EIO;
			return false;
		}
		iov = (struct iovec){buf, (size_t)r};
		if(!write_all(to, &iov, 1, 0)) return false;
		off += (uint64_t)r;
		len -= (uint64_t)r;
	}
	return true;
}

/* Rewrite the file with the live entries only; the old one stays whole until the rename. */
static void compact(void)
{
	unsigned char *buf = malloc(COPY_CHUNK);
	struct iovec iov = {(void *)MAGIC, MAGIC_LEN};
	struct jentry *e;
	uint64_t off = MAGIC_LEN;
	int nfd;

	if(buf == NULL) return;
	nfd = open(tmp_path, O_RDWR | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
	if(nfd < 0 || flock(nfd, LOCK_EX | LOCK_NB) || !write_all(nfd, &iov, 1, 0)){
		goto fail;
	}
	for(e = live_head; e; e = e->next){
		if(!copy_range(nfd, e->off, e->len, buf)) goto fail;
		e->new_off = off;
		off += e->len;
	}
	if(rename(tmp_path, path)) goto fail;
	close(fd);
	fd = nfd;
	file_bytes = off;
	ntrims = 0; /* trimmed entries were not copied */
	for(e = live_head; e; e = e->next) e->off = e->new_off;
	st.compactions++;
	free(buf);
	return;
fail:
	log_error("compacting failed:");
	if(nfd >= 0){
		close(nfd);
		unlink(tmp_path);
	}
	free(buf);
}

static void sweep(int64_t now)
{
	struct jentry *e, *tmp;

	while(live_head && max_age_ms > 0 && now - live_head->born_ms > max_age_ms){
		st.expired++;
		trim(live_head);
	}
	HASH_ITER(hh, q2, e, tmp){
		if(!e->hit && now - e->born_ms > Q2_MAX_AGE_MS){
			st.expired++; /* never released: the publisher did not send its PUBREL */
			trim(e);
		}
	}
	if(live_count == 0 && file_bytes > MAGIC_LEN){
		ntrims = 0;
		if(ftruncate(fd, MAGIC_LEN) == 0){
			file_bytes = MAGIC_LEN;
		}else{
			log_error("truncating failed:");
		}
	}else if(file_bytes >= COMPACT_MIN_BYTES && live_bytes * 4 < file_bytes){
		flush_trims();
		compact();
	}
}

/* End of a loop iteration (TICK): settle the routings, write the trims, sweep each second. */
void journal_tick(void)
{
	int64_t now;

	if(fd < 0) return;
	settle();
	flush_trims();
	now = mono_ms();
	if(now - last_sweep_ms >= SWEEP_MS){
		last_sweep_ms = now;
		sweep(now);
	}
}

void journal_stats(struct journal_stats *s)
{
	*s = st;
	s->live = live_count;
	s->live_bytes = live_bytes;
	s->file_bytes = fd >= 0 ? file_bytes : 0;
}

/* Mosquitto stops: a journal with nothing live is removed; else the next start replays it. */
void journal_cleanup(void)
{
	struct jentry *e, *next;
	struct fp_bucket *b, *tmp;

	if(fd >= 0){
		settle();
		flush_trims();
		if(live_count == 0) unlink(path);
		close(fd);
	}
	fd = -1;
	HASH_CLEAR(hh, q2);
	for(e = live_head; e; e = next){
		next = e->next;
		free(e);
	}
	HASH_ITER(hh, buckets, b, tmp){
		HASH_DEL(buckets, b);
		free(b);
	}
	free(path);
	free(tmp_path);
	path = tmp_path = NULL;
	live_head = live_tail = cur = hits = NULL;
	next_seq = file_bytes = live_bytes = live_count = 0;
	ntrims = 0;
	max_age_ms = last_sweep_ms = 0;
	memset(&st, 0, sizeof(st));
	memset(&error_log, 0, sizeof(error_log));
}
