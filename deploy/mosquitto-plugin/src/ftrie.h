/* A trie of topic filters, counted, for "does any filter match this topic" (ftrie.c). */
#ifndef MQFED_FTRIE_H
#define MQFED_FTRIE_H

#include "util.h"

struct ftrie_node;

struct ftrie {
	struct ftrie_node *root;
	size_t filters;            /* filters added and not removed (each add counts) */
};

bool ftrie_add(struct ftrie *t, const char *filter);
void ftrie_remove(struct ftrie *t, const char *filter);
bool ftrie_matches(const struct ftrie *t, const char *topic);
size_t ftrie_count(const struct ftrie *t, const char *topic);
void ftrie_free(struct ftrie *t);

#endif
