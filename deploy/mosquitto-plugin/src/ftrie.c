/*
 * A trie of topic filters over their levels, each node counting the filters that end on it.
 * `ftrie_matches` answers whether any filter matches a topic in time proportional to the
 * topic's levels times the wildcard branches met, whatever the number of filters (MQTT 5
 * §4.7: '+' one level, '#' the parent and every level below, wildcards at the first level
 * never match a topic starting with '$').
 */
#include <stdlib.h>
#include <string.h>

#include "ftrie.h"

struct ftrie_node {
	UT_hash_handle hh;         /* in the parent's children, keyed by level (its bytes) */
	char *level;
	struct ftrie_node *children;
	size_t count;              /* filters ending here */
};

static struct ftrie_node *child(const struct ftrie_node *n, const char *level, size_t len)
{
	struct ftrie_node *c = NULL;

	HASH_FIND(hh, n->children, level, len, c);
	return c;
}

static void node_free(struct ftrie_node *n)
{
	struct ftrie_node *c, *tmp;

	HASH_ITER(hh, n->children, c, tmp){
		HASH_DEL(n->children, c);
		node_free(c);
	}
	free(n->level);
	free(n);
}

/* Add one occurrence of `filter` (verbatim MQTT filter without $share/<group>/). */
bool ftrie_add(struct ftrie *t, const char *filter)
{
	struct ftrie_node *n;
	const char *p = filter;

	if(t->root == NULL){
		t->root = calloc(1, sizeof(*t->root));
		if(t->root == NULL) return false;
	}
	n = t->root;
	for(;;){
		const char *end = strchr(p, '/');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		struct ftrie_node *c = child(n, p, len);

		if(c == NULL){
			c = calloc(1, sizeof(*c));
			if(c) c->level = malloc(len + 1);
			if(c == NULL || c->level == NULL){
				free(c);
				return false; /* the nodes made so far stay, empty: harmless */
			}
			memcpy(c->level, p, len);
			c->level[len] = '\0';
			HASH_ADD_KEYPTR(hh, n->children, c->level, len, c);
		}
		n = c;
		if(end == NULL) break;
		p = end + 1;
	}
	n->count++;
	t->filters++;
	return true;
}

/* Remove one occurrence from `n` at `p` (the rest of the filter); true when `n` is now empty. */
static bool remove_at(struct ftrie_node *n, const char *p, bool *found)
{
	const char *end = strchr(p, '/');
	size_t len = end ? (size_t)(end - p) : strlen(p);
	struct ftrie_node *c = child(n, p, len);

	if(c == NULL) return false;
	if(end == NULL){
		if(c->count == 0) return false;
		c->count--;
		*found = true;
	}else if(!remove_at(c, end + 1, found)){
		return false;
	}
	if(c->count == 0 && c->children == NULL){
		HASH_DEL(n->children, c);
		free(c->level);
		free(c);
	}
	return n->count == 0 && n->children == NULL;
}

void ftrie_remove(struct ftrie *t, const char *filter)
{
	bool found = false;

	if(t->root == NULL) return;
	remove_at(t->root, filter, &found);
	if(found) t->filters--;
}

static bool match_at(const struct ftrie_node *n, char **levels, size_t i, size_t depth,
		bool dollar)
{
	const struct ftrie_node *c;

	if(i == depth){
		if(n->count) return true;
		c = child(n, "#", 1); /* "a/#" matches "a" */
		return c != NULL && c->count > 0;
	}
	if(i > 0 || !dollar){
		c = child(n, "#", 1);
		if(c != NULL && c->count > 0) return true;
		c = child(n, "+", 1);
		if(c != NULL && match_at(c, levels, i + 1, depth, dollar)) return true;
	}
	if(strcmp(levels[i], "+") == 0 || strcmp(levels[i], "#") == 0) return false;
	c = child(n, levels[i], strlen(levels[i]));
	return c != NULL && match_at(c, levels, i + 1, depth, dollar);
}

/* How many filter occurrences match the topic's levels from `n` on (as match_at, summed). */
static size_t count_at(const struct ftrie_node *n, char **levels, size_t i, size_t depth,
		bool dollar)
{
	const struct ftrie_node *c;
	size_t sum;

	if(i == depth){
		c = child(n, "#", 1); /* "a/#" matches "a" */
		return n->count + (c != NULL ? c->count : 0);
	}
	sum = 0;
	if(i > 0 || !dollar){
		c = child(n, "#", 1);
		if(c != NULL) sum += c->count;
		c = child(n, "+", 1);
		if(c != NULL) sum += count_at(c, levels, i + 1, depth, dollar);
	}
	if(strcmp(levels[i], "+") == 0 || strcmp(levels[i], "#") == 0) return sum;
	c = child(n, levels[i], strlen(levels[i]));
	return sum + (c != NULL ? count_at(c, levels, i + 1, depth, dollar) : 0);
}

/* The topic's levels: a copy with '/' cut to NULs, and pointers to each (free both). */
static bool split(const char *topic, char **copy, char ***levels, size_t *depth)
{
	char *p;
	size_t i = 0;

	*depth = 1;
	for(p = (char *)topic; *p; p++){
		if(*p == '/') (*depth)++;
	}
	*copy = strdup(topic);
	*levels = malloc(*depth * sizeof(**levels));
	if(*copy == NULL || *levels == NULL){
		free(*copy);
		free(*levels);
		return false;
	}
	(*levels)[i++] = *copy;
	for(p = *copy; *p; p++){
		if(*p == '/'){
			*p = '\0';
			(*levels)[i++] = p + 1;
		}
	}
	return true;
}

/* Whether any filter matches `topic` (a topic name: no wildcards). On out of memory: true. */
bool ftrie_matches(const struct ftrie *t, const char *topic)
{
	char *copy, **levels;
	size_t depth;
	bool match;

	if(t->root == NULL || t->filters == 0) return false;
	if(!split(topic, &copy, &levels, &depth)){
		return true; /* err on shedding: never let an unmatched copy through unnoticed */
	}
	match = match_at(t->root, levels, 0, depth, topic[0] == '$');
	free(levels);
	free(copy);
	return match;
}

/* How many filters (each occurrence added) match `topic`; SIZE_MAX on out of memory. */
size_t ftrie_count(const struct ftrie *t, const char *topic)
{
	char *copy, **levels;
	size_t depth, n;

	if(t->root == NULL || t->filters == 0) return 0;
	if(!split(topic, &copy, &levels, &depth)) return SIZE_MAX;
	n = count_at(t->root, levels, 0, depth, topic[0] == '$');
	free(levels);
	free(copy);
	return n;
}

void ftrie_free(struct ftrie *t)
{
	if(t->root) node_free(t->root);
	t->root = NULL;
	t->filters = 0;
}
