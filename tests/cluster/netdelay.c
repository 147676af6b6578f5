/* netdelay: adds a fixed delay to the packets of one netfilter queue, for the multi-host test's
 * slow links on kernels without sch_netem (CONFIG_NET_SCH_NETEM unset, where `tc qdisc add ...
 * netem delay 50ms` answers "Specified qdisc kind is unknown"). It needs only
 * CONFIG_NETFILTER_NETLINK_QUEUE and the xt NFQUEUE target, and only libc: it speaks
 * nfnetlink_queue over a raw NETLINK_NETFILTER socket.
 *
 *   netdelay --queue N --delay-ms D [--seconds S]
 *
 * binds queue N (metadata only, no payload copies; queue length 65536; fail-open, so that when
 * the queue is full packets pass undelayed rather than being dropped) and accepts every queued
 * packet D ms after it was received, in arrival order. It stops after S seconds (default 600),
 * or on SIGTERM/SIGINT: then it lets new packets through undelayed, accepts every packet it
 * holds, unbinds, and prints one line: packets delayed, the largest number held at once, and
 * how many were let through early (queue notices lost to a full socket buffer, or none).
 * Errors are named ("netdelay: bind queue 0: Operation not permitted") and exit 1.
 *
 * Use (root, in the namespace whose egress should be slow; both iptables-nft, the Debian 12
 * default, and iptables-legacy work):
 *   ip netns exec H iptables -A OUTPUT -o eth0 -j NFQUEUE --queue-num 0 --queue-bypass
 *   ip netns exec H netdelay --queue 0 --delay-ms 50 --seconds 600 &
 * Every packet H sends on eth0 then leaves D ms later, like `tc qdisc add dev eth0 root netem
 * delay 50ms` (a round trip through H gets +D ms; put it in both hosts for +2D). Keep
 * --queue-bypass: without it the rule drops packets whenever no netdelay is bound. Bind one
 * netdelay per namespace (queues are per network namespace). Delete the rule when done
 * (`iptables -D OUTPUT ...`, or the namespace).
 *
 * How: packets are released with batch verdicts (NFQNL_MSG_VERDICT_BATCH, "accept every id up
 * to X"), so one message releases everything that is due, and a packet whose queue notice was
 * lost (ENOBUFS) goes out with the next one after it rather than being held forever. Memory is
 * bounded: a ring of (id, deadline) as long as the kernel queue; should it fill, the oldest
 * packet goes out early. The delay is measured from when netdelay reads the notice, so it is D
 * plus the (normally microseconds of) scheduling latency. Limits: no jitter, loss or rate
 * options; only the packets the rule sends to the queue are delayed; big GSO packets are
 * queued whole (NFQA_CFG_F_GSO) where the kernel supports it.
 *
 * Build: cc -O2 -Wall -Wextra -o netdelay tests/cluster/netdelay.c
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define ND_RING 65536u /* held packets at most, and the kernel queue length */
#define ND_BUF 65536   /* one netlink datagram */
#define ND_DRAIN 512   /* datagrams read before looking at deadlines again */

struct nd_held {
    uint32_t id;
    int64_t due_ns;
};

struct nd {
    int fd;
    uint16_t queue;
    int64_t delay_ns;
    uint32_t seq;       /* last request sequence number */
    uint32_t ack_seq;   /* request whose answer is awaited (0: none) */
    int ack_err;        /* its answer: 0 or -errno; 1 while awaited */
    struct nd_held *ring;
    uint32_t head, n;   /* oldest held packet, number held */
    uint32_t last_id;   /* newest id seen */
    int seen_any;
    int fail_open;
    uint64_t delayed, early, lost_notices, max_depth;
    char buf[ND_BUF] __attribute__((aligned(8)));
};

static volatile sig_atomic_t nd_stop;

static void nd_on_signal(int sig)
{
    (void)sig;
    nd_stop = 1;
}

static int64_t nd_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int nd_fail(const char *fmt, ...)
{
    va_list ap;
    fputs("netdelay: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return -1;
}

/* ---- building and sending nfnetlink messages ---- */

struct nd_msg {
    char b[256] __attribute__((aligned(8)));
    size_t len;
};

static void nd_msg_start(struct nd *d, struct nd_msg *m, uint16_t type, uint16_t flags)
{
    memset(m, 0, sizeof(*m));
    struct nlmsghdr *h = (struct nlmsghdr *)m->b;
    h->nlmsg_type = (uint16_t)((NFNL_SUBSYS_QUEUE << 8) | type);
    h->nlmsg_flags = (uint16_t)(NLM_F_REQUEST | flags);
    h->nlmsg_seq = ++d->seq;
    struct nfgenmsg *g = (struct nfgenmsg *)NLMSG_DATA(h);
    g->nfgen_family = AF_UNSPEC;
    g->version = NFNETLINK_V0;
    g->res_id = htons(d->queue);
    m->len = NLMSG_LENGTH(sizeof(*g));
}

static void nd_msg_attr(struct nd_msg *m, uint16_t type, const void *data, size_t len)
{
    struct nlattr *a = (struct nlattr *)(m->b + NLMSG_ALIGN(m->len));
    a->nla_type = type;
    a->nla_len = (uint16_t)(NLA_HDRLEN + len);
    memcpy((char *)a + NLA_HDRLEN, data, len);
    m->len = NLMSG_ALIGN(m->len) + NLA_ALIGN(a->nla_len);
}

static int nd_msg_send(struct nd *d, struct nd_msg *m)
{
    struct nlmsghdr *h = (struct nlmsghdr *)m->b;
    h->nlmsg_len = (uint32_t)m->len;
    struct sockaddr_nl k = {.nl_family = AF_NETLINK};
    for (;;) {
        ssize_t r = sendto(d->fd, m->b, m->len, 0, (struct sockaddr *)&k, sizeof(k));
        if (r == (ssize_t)m->len) return 0;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == ENOBUFS) { /* our receive side overflowed, not the send */
            d->lost_notices++;
            continue;
        }
        return -errno;
    }
}

/* Accept every held packet with an id up to and including max_id (ids are per queue, in
 * arrival order, compared modulo 2^32 by the kernel). */
static int nd_accept_upto(struct nd *d, uint32_t max_id)
{
    struct nd_msg m;
    nd_msg_start(d, &m, NFQNL_MSG_VERDICT_BATCH, 0);
    struct nfqnl_msg_verdict_hdr v = {.verdict = htonl(NF_ACCEPT), .id = htonl(max_id)};
    nd_msg_attr(&m, NFQA_VERDICT_HDR, &v, sizeof(v));
    int e = nd_msg_send(d, &m);
    if (e) nd_fail("verdict on queue %u: %s", (unsigned)d->queue, strerror(-e));
    return e;
}

/* ---- the ring of held packets ---- */

static void nd_hold(struct nd *d, uint32_t id, int64_t now)
{
    if (d->n == ND_RING) { /* cannot happen while the kernel queue is as long; be safe */
        struct nd_held *o = &d->ring[d->head];
        nd_accept_upto(d, o->id);
        d->head = (d->head + 1) % ND_RING;
        d->n--;
        d->early++;
    }
    struct nd_held *h = &d->ring[(d->head + d->n) % ND_RING];
    h->id = id;
    h->due_ns = now + d->delay_ns;
    d->n++;
    d->delayed++;
    d->last_id = id;
    d->seen_any = 1;
    if (d->n > d->max_depth) d->max_depth = d->n;
}

/* Release everything due by now with one batch verdict. */
static void nd_release_due(struct nd *d, int64_t now)
{
    uint32_t k = 0, last = 0;
    while (k < d->n && d->ring[(d->head + k) % ND_RING].due_ns <= now) {
        last = d->ring[(d->head + k) % ND_RING].id;
        k++;
    }
    if (!k) return;
    nd_accept_upto(d, last);
    d->head = (d->head + k) % ND_RING;
    d->n -= k;
}

/* ---- receiving ---- */

static void nd_on_packet(struct nd *d, struct nlmsghdr *h, int64_t now)
{
    size_t off = NLMSG_ALIGN(sizeof(struct nfgenmsg));
    size_t len = h->nlmsg_len - NLMSG_HDRLEN;
    const char *p = (const char *)NLMSG_DATA(h);
    while (off + NLA_HDRLEN <= len) {
        const struct nlattr *a = (const struct nlattr *)(p + off);
        if (a->nla_len < NLA_HDRLEN || off + a->nla_len > len) break;
        if ((a->nla_type & NLA_TYPE_MASK) == NFQA_PACKET_HDR &&
            a->nla_len >= NLA_HDRLEN + sizeof(struct nfqnl_msg_packet_hdr)) {
            struct nfqnl_msg_packet_hdr ph;
            memcpy(&ph, (const char *)a + NLA_HDRLEN, sizeof(ph));
            nd_hold(d, ntohl(ph.packet_id), now);
            return;
        }
        off += NLA_ALIGN(a->nla_len);
    }
}

static void nd_on_message(struct nd *d, struct nlmsghdr *h, int64_t now)
{
    if (h->nlmsg_type == NLMSG_ERROR) {
        const struct nlmsgerr *e = (const struct nlmsgerr *)NLMSG_DATA(h);
        if (h->nlmsg_len < NLMSG_LENGTH(sizeof(*e))) return;
        if (d->ack_seq && h->nlmsg_seq == d->ack_seq) {
            d->ack_err = e->error;
            d->ack_seq = 0;
        }
        /* other errors answer batch verdicts that found nothing (ENOENT): harmless */
        return;
    }
    if (h->nlmsg_type == ((NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET))
        nd_on_packet(d, h, now);
}

/* Read and handle up to max datagrams without blocking. Returns 0, or -errno. */
static int nd_drain(struct nd *d, int max)
{
    for (int i = 0; i < max; i++) {
        ssize_t r = recv(d->fd, d->buf, sizeof(d->buf), MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            if (errno == EINTR) continue;
            if (errno == ENOBUFS) { /* notices dropped; their packets go with later ones */
                d->lost_notices++;
                continue;
            }
            return -errno;
        }
        int64_t now = nd_now_ns();
        size_t left = (size_t)r;
        for (struct nlmsghdr *h = (struct nlmsghdr *)d->buf; NLMSG_OK(h, left);
             h = NLMSG_NEXT(h, left))
            nd_on_message(d, h, now);
    }
    return 0;
}

/* Send a config request and wait (handling packets meanwhile) for its answer. */
static int nd_config(struct nd *d, struct nd_msg *m)
{
    d->ack_seq = ((struct nlmsghdr *)m->b)->nlmsg_seq;
    d->ack_err = 1;
    int e = nd_msg_send(d, m);
    if (e) {
        d->ack_seq = 0;
        return e;
    }
    int64_t give_up = nd_now_ns() + 5000000000LL;
    while (d->ack_err == 1) {
        int64_t now = nd_now_ns();
        if (now >= give_up) {
            d->ack_seq = 0;
            return -ETIMEDOUT;
        }
        struct pollfd pfd = {.fd = d->fd, .events = POLLIN};
        int pr = poll(&pfd, 1, 100);
        if (pr < 0 && errno != EINTR) return -errno;
        if ((e = nd_drain(d, ND_DRAIN))) return e;
        nd_release_due(d, nd_now_ns());
    }
    return d->ack_err;
}

static int nd_config_cmd(struct nd *d, uint8_t cmd)
{
    struct nd_msg m;
    nd_msg_start(d, &m, NFQNL_MSG_CONFIG, NLM_F_ACK);
    struct nfqnl_msg_config_cmd c = {.command = cmd};
    nd_msg_attr(&m, NFQA_CFG_CMD, &c, sizeof(c));
    return nd_config(d, &m);
}

static int nd_config_maxlen(struct nd *d, uint32_t maxlen)
{
    struct nd_msg m;
    nd_msg_start(d, &m, NFQNL_MSG_CONFIG, NLM_F_ACK);
    uint32_t v = htonl(maxlen);
    nd_msg_attr(&m, NFQA_CFG_QUEUE_MAXLEN, &v, sizeof(v));
    return nd_config(d, &m);
}

static int nd_config_flags(struct nd *d, uint32_t flags)
{
    struct nd_msg m;
    nd_msg_start(d, &m, NFQNL_MSG_CONFIG, NLM_F_ACK);
    uint32_t v = htonl(flags);
    nd_msg_attr(&m, NFQA_CFG_MASK, &v, sizeof(v));
    nd_msg_attr(&m, NFQA_CFG_FLAGS, &v, sizeof(v));
    return nd_config(d, &m);
}

/* ---- setup and teardown ---- */

static int nd_open(struct nd *d)
{
    d->fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
    if (d->fd < 0) return nd_fail("netlink socket: %s", strerror(errno));
    struct sockaddr_nl me = {.nl_family = AF_NETLINK};
    if (bind(d->fd, (struct sockaddr *)&me, sizeof(me)))
        return nd_fail("bind netlink socket: %s", strerror(errno));
    int sz = 64 << 20; /* room for many notices between reads */
    if (setsockopt(d->fd, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof(sz)))
        setsockopt(d->fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
    return 0;
}

static int nd_bind(struct nd *d)
{
    unsigned q = d->queue;
    int e = nd_config_cmd(d, NFQNL_CFG_CMD_BIND);
    if (e) return nd_fail("bind queue %u: %s", q, strerror(-e));
    struct nd_msg m;
    nd_msg_start(d, &m, NFQNL_MSG_CONFIG, NLM_F_ACK);
    struct nfqnl_msg_config_params p = {.copy_range = htonl(0), .copy_mode = NFQNL_COPY_META};
    nd_msg_attr(&m, NFQA_CFG_PARAMS, &p, sizeof(p));
    if ((e = nd_config(d, &m))) { /* kernels before COPY_META: copy nothing */
        nd_msg_start(d, &m, NFQNL_MSG_CONFIG, NLM_F_ACK);
        p.copy_mode = NFQNL_COPY_NONE;
        nd_msg_attr(&m, NFQA_CFG_PARAMS, &p, sizeof(p));
        if ((e = nd_config(d, &m))) return nd_fail("queue %u copy mode: %s", q, strerror(-e));
    }
    if ((e = nd_config_maxlen(d, ND_RING)))
        return nd_fail("queue %u length %u: %s", q, ND_RING, strerror(-e));
    if (!nd_config_flags(d, NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO) ||
        !nd_config_flags(d, NFQA_CFG_F_FAIL_OPEN))
        d->fail_open = 1;
    else
        fprintf(stderr, "netdelay: queue %u: no fail-open; a full queue drops packets\n", q);
    return 0;
}

/* Let new packets pass undelayed, accept all held ones (also those whose notice was lost),
 * unbind. */
static void nd_close(struct nd *d)
{
    if (d->fail_open) nd_config_maxlen(d, 0); /* a full queue with fail-open: bypass */
    nd_drain(d, ND_DRAIN);
    nd_accept_upto(d, d->last_id + 0x40000000u); /* "every id up to far ahead": all held */
    d->n = 0;
    int e = nd_config_cmd(d, NFQNL_CFG_CMD_UNBIND);
    if (e) nd_fail("unbind queue %u: %s", (unsigned)d->queue, strerror(-e));
    close(d->fd);
}

/* ---- main loop ---- */

static int nd_run(struct nd *d, int64_t end_ns, const sigset_t *unblocked)
{
    while (!nd_stop) {
        int64_t now = nd_now_ns();
        if (now >= end_ns) break;
        int64_t wake = end_ns;
        if (d->n && d->ring[d->head].due_ns < wake) wake = d->ring[d->head].due_ns;
        int64_t wait = wake > now ? wake - now : 0;
        struct timespec ts = {.tv_sec = wait / 1000000000, .tv_nsec = wait % 1000000000};
        struct pollfd pfd = {.fd = d->fd, .events = POLLIN};
        int pr = ppoll(&pfd, 1, &ts, unblocked);
        if (pr < 0 && errno != EINTR) return nd_fail("poll: %s", strerror(errno));
        if (pr > 0) {
            if (pfd.revents & (POLLERR | POLLNVAL) && !(pfd.revents & POLLIN)) {
                int e = nd_drain(d, 1); /* reads the pending socket error (ENOBUFS) */
                if (e) return nd_fail("queue %u: %s", (unsigned)d->queue, strerror(-e));
            }
            int e = nd_drain(d, ND_DRAIN);
            if (e) return nd_fail("read queue %u: %s", (unsigned)d->queue, strerror(-e));
        }
        nd_release_due(d, nd_now_ns());
    }
    return 0;
}

static int nd_parse_num(const char *flag, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || errno || end == s || *end || v < lo || v > hi)
        return nd_fail("%s wants a number from %ld to %ld, not '%s'", flag, lo, hi,
                       s ? s : "");
    *out = v;
    return 0;
}

static int nd_usage(void)
{
    fputs("usage: netdelay --queue N --delay-ms D [--seconds S]\n", stderr);
    return 1;
}

int main(int argc, char **argv)
{
    long queue = -1, delay = -1, secs = 600;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad;
        if (!strcmp(a, "--queue")) bad = nd_parse_num(a, v, 0, 65535, &queue);
        else if (!strcmp(a, "--delay-ms")) bad = nd_parse_num(a, v, 0, 3600000, &delay);
        else if (!strcmp(a, "--seconds")) bad = nd_parse_num(a, v, 1, 31L * 86400, &secs);
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) return nd_usage(), 0;
        else return nd_fail("unknown option '%s'", a), nd_usage();
        if (bad) return 1;
        i++;
    }
    if (queue < 0 || delay < 0) return nd_usage();

    static struct nd d;
    static struct nd_held ring[ND_RING];
    d.ring = ring;
    d.queue = (uint16_t)queue;
    d.delay_ns = (int64_t)delay * 1000000;

    /* SIGTERM/SIGINT are blocked except inside ppoll, so none is missed between checks. */
    sigset_t block, unblocked;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigprocmask(SIG_BLOCK, &block, &unblocked);
    sigdelset(&unblocked, SIGTERM);
    sigdelset(&unblocked, SIGINT);
    struct sigaction sa = {.sa_handler = nd_on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (nd_open(&d) || nd_bind(&d)) return 1;
    int rc = nd_run(&d, nd_now_ns() + (int64_t)secs * 1000000000, &unblocked) ? 1 : 0;
    nd_close(&d);
    printf("netdelay: queue %ld: %llu packets delayed %ld ms, max queue depth %llu, "
           "%llu let through early, %llu queue notices lost\n",
           queue, (unsigned long long)d.delayed, delay, (unsigned long long)d.max_depth,
           (unsigned long long)d.early, (unsigned long long)d.lost_notices);
    fflush(stdout);
    return rc;
}
