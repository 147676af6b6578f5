/* corpus.h — a small generated corpus of simple stories from a grammar, for training the default
 * demo model on a machine that has nothing else (no data set can be downloaded). */
#ifndef ZS_CORPUS_H
#define ZS_CORPUS_H

#include <stdint.h>

/* Writes n stories as JSONL ({"text": ...}, one per line) to path, atomically; the same seed
 * gives the same file. */
int zs_corpus_write(const char *path, int n, uint64_t seed);

#endif
