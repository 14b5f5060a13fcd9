#!/bin/sh
# `iperf3` in the zcnet image: zcnet's iperf3 mode, which takes iperf3's flags and speaks
# its protocol on the wire (an unmodified iperf3 at the other end works too).
exec zcnet bench "$@"
