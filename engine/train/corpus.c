/* corpus.c — simple stories from a small grammar (names, animals, places, things, feelings),
 * written as JSONL training data for the demo model. */
#include "corpus.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

static const char *names[] = {"Lily", "Tom", "Mia", "Ben", "Sam", "Anna", "Max", "Lucy", "Tim", "Sara"};
static const char *animals[] = {"dog", "cat", "bird", "bunny", "duck", "fox", "frog", "horse"};
static const char *adjs[] = {"little", "big", "happy", "red", "soft", "funny", "brave", "shiny"};
static const char *places[] = {"park", "garden", "forest", "beach", "farm", "lake", "hill", "town"};
static const char *things[] = {"ball", "kite", "box", "flower", "hat", "stone", "boat", "cake"};
static const char *verbs[] = {"play", "run", "sing", "jump", "dance", "swim", "read", "paint"};
static const char *feelings[] = {"happy", "glad", "proud", "excited", "calm", "thankful"};

#define PICK(a) a[(int)(next(&s) % (sizeof a / sizeof a[0]))]

static uint64_t next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void story(uint64_t seed, char *out, size_t cap) {
    uint64_t s = seed;
    const char *who = PICK(names), *friend = PICK(names), *animal = PICK(animals), *adj = PICK(adjs);
    while (friend == who) friend = PICK(names);
    const char *place = PICK(places), *thing = PICK(things), *thing_adj = PICK(adjs), *verb = PICK(verbs);
    const char *feel = PICK(feelings);
    switch (next(&s) % 3) {
    case 0:
        snprintf(out, cap,
                 "Once upon a time, there was a %s %s named %s. Every day, %s went to the %s to %s. "
                 "One day, %s found a %s %s. %s showed it to %s, and they were very %s.",
                 adj, animal, who, who, place, verb, who, thing_adj, thing, who, friend, feel);
        break;
    case 1:
        snprintf(out, cap,
                 "%s had a %s %s. One day, %s and the %s went to the %s. They saw a %s %s. "
                 "%s said, \\\"Let's %s!\\\" They played all day and felt %s.",
                 who, adj, animal, who, animal, place, thing_adj, thing, who, verb, feel);
        break;
    default:
        snprintf(out, cap,
                 "%s and %s liked to %s at the %s. One day, they lost their %s %s. "
                 "A %s %s helped them find it. %s and %s were %s and said thank you.",
                 who, friend, verb, place, thing_adj, thing, adj, animal, who, friend, feel);
    }
}

int zs_corpus_write(const char *path, int n, uint64_t seed) {
    if (n < 1) return zs_err(ZS_EINVAL, "corpus: the number of stories must be positive");
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return zs_err(ZS_EIO, "corpus: cannot write %s: %s", tmp, strerror(errno));
    char buf[1024];
    for (int i = 0; i < n; i++) {
        story(seed * 1000003u + (uint64_t)i, buf, sizeof buf);
        fprintf(f, "{\"text\": \"%s\"}\n", buf);
    }
    int bad = ferror(f);
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) bad = 1;
    if (fclose(f) != 0) bad = 1;
    if (bad || rename(tmp, path) != 0) {
        unlink(tmp);
        return zs_err(ZS_EIO, "corpus: cannot write %s", path);
    }
    return 0;
}
