// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * zcnet's XDP program for Lightweight Messages over AF_XDP (docs/lm-afxdp.md, seed 004 §3.3).
 *
 * The LM receiver posts FILL chunks so that the fragments of one message, arriving last
 * first, land back to back in the UMEM (driver-level defragmentation). That only works if
 * exactly the admitted sender's fragments, in exactly the announced order, reach the socket:
 * one foreign or out-of-order frame would take a chunk meant for another fragment, and
 * because each frame's headers are overwritten by the next fragment, user space could no
 * longer tell. So admission control is enforced here, before a chunk is taken:
 *
 *   - LM frames (UDP to `udp_port_be`, LM magic, kind DATA or PAD) from anyone but the
 *     admitted sender address, port and token are dropped (`foreign`);
 *   - DATA frames must come in the order count-1, count-2, ..., 0; the first one out of
 *     order breaks the message and it and every later frame of it are dropped (`order`),
 *     so the chunks already posted stay untouched and user space reports the message lost;
 *   - PAD frames of the admitted token pass without an index: the sender sends one per
 *     chunk left on the FILL ring by an earlier lost message, ahead of its fragments;
 *   - every other frame (the LM control messages, ARP, other ports) goes to the stack.
 *
 * `lm_admit` is written by user space only (between messages); `lm_progress` by this
 * program only (one rx queue is served by one CPU at a time), so neither needs atomics.
 * Both are arrays of one entry of eight words; the layout is mirrored in src/lm/program.rs.
 * The types, the XSKMAP and `udp_port_be` are xdp.h's, shared with xsk_redirect.c.
 */

#include "xdp.h"

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;

struct words {
	__u32 w[8];
};

XSKMAP(zcnet_lm_xsks);

/* Admission, set by the receiver. */
#define A_ACTIVE 0 /* 1 while a sender is admitted */
#define A_SADDR 1 /* its IPv4 address, as the 4 bytes on the wire */
#define A_SPORT 2 /* its UDP source port, as the 2 bytes on the wire (low half) */
#define A_TOKEN 3 /* the admission token, as the 4 bytes on the wire */
#define A_COUNT 4 /* fragments in the message (host order) */
#define A_DROP_EVERY 5 /* fault injection: drop every n-th DATA frame (0: never) */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct words);
} zcnet_lm_admit SEC(".maps");

/* Progress and counters, kept by this program. */
#define P_TOKEN 0 /* the token the counts below belong to */
#define P_RECEIVED 1 /* DATA frames of that token passed to the socket */
#define P_BROKEN 2 /* 1 once a frame of that token came out of order */
#define P_FOREIGN 3 /* LM frames dropped: no admission, or not the admitted sender */
#define P_ORDER 4 /* DATA frames dropped: out of order, or after the break */
#define P_INJECTED 5 /* DATA frames dropped by A_DROP_EVERY */
#define P_SEEN 6 /* DATA frames of admitted senders, ever (for A_DROP_EVERY) */
#define P_PADS 7 /* PAD frames passed to the socket, ever */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct words);
} zcnet_lm_progress SEC(".maps");

#define IP_HLEN 20
#define LM_HLEN 24
#define LM_MAGIC_0 'L'
#define LM_MAGIC_1 'M'
#define LM_VERSION 1
#define LM_DATA 1
#define LM_PAD 2

SEC("xdp")
int zcnet_lm(struct xdp_md *ctx)
{
	__u8 *data = (__u8 *)(long)ctx->data;
	__u8 *end = (__u8 *)(long)ctx->data_end;
	__u32 zero = 0;

	/* Ethernet, IPv4 without options (what LM senders write), UDP, LM header. */
	if (data + ETH_HLEN + IP_HLEN + UDP_HLEN + LM_HLEN > end)
		return XDP_PASS;
	if (data[12] != 0x08 || data[13] != 0x00)
		return XDP_PASS;
	__u8 *ip = data + ETH_HLEN;
	if (ip[0] != 0x45 || ip[9] != 17)
		return XDP_PASS;
	if ((ip[6] & 0x1f) != 0 || ip[7] != 0)
		return XDP_PASS;
	__u8 *udp = ip + IP_HLEN;
	if (*(__u16 *)(udp + 2) != udp_port_be)
		return XDP_PASS;
	__u8 *lm = udp + UDP_HLEN;
	if (lm[0] != LM_MAGIC_0 || lm[1] != LM_MAGIC_1 || lm[2] != LM_VERSION)
		return XDP_PASS;
	__u8 kind = lm[3];
	if (kind != LM_DATA && kind != LM_PAD)
		return XDP_PASS; /* control: REQ, ENDME, ... go to the socket */

	struct words *a = bpf_map_lookup_elem(&zcnet_lm_admit, &zero);
	struct words *p = bpf_map_lookup_elem(&zcnet_lm_progress, &zero);
	if (!a || !p)
		return XDP_DROP;
	__u32 token = *(__u32 *)(lm + 4);
	if (a->w[A_ACTIVE] != 1 || *(__u32 *)(ip + 12) != a->w[A_SADDR] ||
	    (__u32) * (__u16 *)(udp + 0) != a->w[A_SPORT] || token != a->w[A_TOKEN]) {
		p->w[P_FOREIGN] += 1;
		return XDP_DROP;
	}
	if (p->w[P_TOKEN] != token) {
		p->w[P_TOKEN] = token;
		p->w[P_RECEIVED] = 0;
		p->w[P_BROKEN] = 0;
	}
	if (kind == LM_PAD) {
		p->w[P_PADS] += 1;
		return bpf_redirect_map(&zcnet_lm_xsks, ctx->rx_queue_index, XDP_DROP);
	}
	if (p->w[P_BROKEN]) {
		p->w[P_ORDER] += 1;
		return XDP_DROP;
	}
	p->w[P_SEEN] += 1;
	__u32 every = a->w[A_DROP_EVERY];
	if (every && p->w[P_SEEN] % every == 0) {
		/* The message is lost now; the rest of it is dropped unseen, as for order. */
		p->w[P_INJECTED] += 1;
		p->w[P_BROKEN] = 1;
		return XDP_DROP;
	}
	__u32 index = __builtin_bswap32(*(__u32 *)(lm + 12));
	__u32 count = a->w[A_COUNT];
	if (p->w[P_RECEIVED] >= count || index != count - 1 - p->w[P_RECEIVED]) {
		p->w[P_BROKEN] = 1;
		p->w[P_ORDER] += 1;
		return XDP_DROP;
	}
	p->w[P_RECEIVED] += 1;
	return bpf_redirect_map(&zcnet_lm_xsks, ctx->rx_queue_index, XDP_DROP);
}

char _license[] SEC("license") = "Dual MIT/GPL";
