// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * What both XDP programs here share: the kernel's uAPI types and numbers they use, libbpf's
 * spelling of BTF-defined maps, the XSKMAP a program redirects into, and the UDP port it
 * filters on.
 *
 * Self-contained on purpose: no libbpf or kernel headers, so `clang -target bpf` is the only
 * build dependency (build.sh). Helper and map-type numbers are the kernel's stable uAPI
 * (include/uapi/linux/bpf.h: BPF_FUNC_redirect_map = 51, BPF_MAP_TYPE_XSKMAP = 17).
 */
#ifndef ZCNET_XDP_H
#define ZCNET_XDP_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;

/* include/uapi/linux/bpf.h */
struct xdp_md {
	__u32 data;
	__u32 data_end;
	__u32 data_meta;
	__u32 ingress_ifindex;
	__u32 rx_queue_index;
	__u32 egress_ifindex;
};

enum xdp_action { XDP_ABORTED = 0, XDP_DROP, XDP_PASS, XDP_TX, XDP_REDIRECT };

#define BPF_MAP_TYPE_ARRAY 2
#define BPF_MAP_TYPE_XSKMAP 17
#define SEC(name) __attribute__((section(name), used))
/* BTF-defined map attributes, as libbpf's bpf_helpers.h spells them. */
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

/* The third argument's low bits are the action when the map slot is empty (kernel >= 5.3). */
static long (*bpf_redirect_map)(void *map, __u64 key, __u64 flags) = (void *)51;

/* An XSKMAP named `name`: slots are queue ids; 64 covers any veth (one queue per possible
 * CPU) and most NICs. */
#define XSKMAP(name)                               \
	struct {                                   \
		__uint(type, BPF_MAP_TYPE_XSKMAP); \
		__uint(max_entries, 64);           \
		__type(key, __u32);                \
		__type(value, __u32);              \
	} name SEC(".maps")

/* The IPv4 UDP destination port to filter on, in network byte order. The loader sets it
 * before loading (a `.rodata` constant, so the verifier sees a known value). */
volatile const __u16 udp_port_be = 0;

#define ETH_HLEN 14
#define UDP_HLEN 8

#endif
