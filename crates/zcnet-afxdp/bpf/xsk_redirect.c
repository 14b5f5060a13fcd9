// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * zcnet's XDP program for AF_XDP receive (docs/lm-afxdp.md).
 *
 * Frames that match the filter go to the AF_XDP socket bound to the receiving queue
 * (bpf_redirect_map on an XSKMAP keyed by rx_queue_index); everything else, and every frame
 * on a queue without a socket, goes on to the kernel stack (XDP_PASS). So ARP, ICMP and the
 * host's other traffic keep working on an interface that also feeds an XSK, which the
 * libxdp default program (redirect everything) does not allow.
 *
 * Filter: IPv4 UDP with destination port `udp_port_be` (network byte order); 0 redirects
 * every frame. The loader sets it before loading (a `.rodata` constant, so the verifier
 * sees a known value and the check costs nothing when it is 0).
 *
 * The types, the XSKMAP and `udp_port_be` are xdp.h's, shared with lm.c.
 */

#include "xdp.h"

XSKMAP(zcnet_xsks);

#define IP_MIN_HLEN 20

SEC("xdp")
int zcnet_xsk_redirect(struct xdp_md *ctx)
{
	__u8 *data = (__u8 *)(long)ctx->data;
	__u8 *end = (__u8 *)(long)ctx->data_end;

	if (udp_port_be) {
		if (data + ETH_HLEN + IP_MIN_HLEN + UDP_HLEN > end)
			return XDP_PASS;
		/* EtherType IPv4 (0x0800), no VLAN tag. */
		if (data[12] != 0x08 || data[13] != 0x00)
			return XDP_PASS;
		__u8 *ip = data + ETH_HLEN;
		/* Version 4, protocol 17 (UDP). Fragments other than the first carry no UDP header. */
		if ((ip[0] & 0xf0) != 0x40 || ip[9] != 17)
			return XDP_PASS;
		if ((ip[6] & 0x1f) != 0 || ip[7] != 0)
			return XDP_PASS;
		__u32 ihl = (ip[0] & 0x0f) * 4;
		if (ihl < IP_MIN_HLEN)
			return XDP_PASS;
		__u8 *udp = ip + ihl;
		if (udp + UDP_HLEN > end)
			return XDP_PASS;
		if (*(__u16 *)(udp + 2) != udp_port_be)
			return XDP_PASS;
	}
	return bpf_redirect_map(&zcnet_xsks, ctx->rx_queue_index, XDP_PASS);
}

char _license[] SEC("license") = "Dual MIT/GPL";
