"""What the executables of pScheduler's tool plugin for zcnet share.

pScheduler runs a tool plugin as a set of executables, each reading one JSON document on
its standard input and printing one on its standard output (the plugin API of
perfSONAR's pScheduler; `enumerate`, `can-run`, `duration`, `participant-data`, `run`,
`merged-results`). This plugin runs pScheduler's `throughput` test with `zcnet bench` in
its iperf3 mode: the client (participant 0) runs `zcnet bench -c DEST -J`, the server
(participant 1) `zcnet bench -s -1 -J`, and the client's `-J` document, which carries both
ends' counts from the results exchange, becomes the result. Python 3's standard library
only, so it runs wherever pScheduler's own tools run.

zcnet's own figures (CPU seconds per GiB at each end, the share of bytes moved without a
copy, the paths in effect) go into the result's `diags`, since the throughput result
schema admits no other fields.
"""

import configparser
import datetime
import json
import os
import re
import subprocess
import sys
import time

NAME = "zcnet"
VERSION = "1.0"
DEFAULT_DURATION = 10
DEFAULT_SERVER_PORT = 5201
DEFAULT_ZCNET = "/usr/bin/zcnet"
# Seconds the client waits for the server on the other side to listen, and the server's
# allowance to wind down: as pScheduler's iperf3 tool allows.
WAIT_FOR_SERVER = 3
SERVER_SHUTDOWN = 2
CONFIG_FILE = "/etc/pscheduler/tool/zcnet.conf"

# The throughput spec's options this tool runs. Others (omit, window-size, mss,
# congestion, fq-rate, ip-tos, flow-label, CPU affinities) are refused by can-run:
# zcnet bench would refuse them too rather than run something else.
SUPPORTED = {
    "schema", "source", "source-node", "dest", "dest-node", "duration", "interval",
    "parallel", "udp", "bandwidth", "buffer-length", "reverse", "zero-copy", "no-delay",
    "ip-version", "local-address", "link-rtt", "loopback", "single-ended",
    "single-ended-port",
}


def load():
    """The JSON document on standard input ({} for an empty one)."""
    text = sys.stdin.read()
    if not text.strip():
        return {}
    try:
        return json.loads(text)
    except ValueError as e:
        fail(f"Invalid JSON on standard input: {e}")


def succeed(doc):
    print(json.dumps(doc, indent=2, sort_keys=True))
    sys.exit(0)


def fail(message):
    print(message, file=sys.stderr)
    sys.exit(1)


def config():
    """`zcnet_cmd` and `server_port` from the tool's configuration file, if any
    (`$ZCNET_PSCHEDULER_CONF` names another file, for tests)."""
    out = {"zcnet_cmd": DEFAULT_ZCNET, "server_port": DEFAULT_SERVER_PORT}
    parser = configparser.ConfigParser()
    parser.read(os.environ.get("ZCNET_PSCHEDULER_CONF", CONFIG_FILE))
    if parser.has_option("zcnet", "zcnet_cmd"):
        out["zcnet_cmd"] = parser.get("zcnet", "zcnet_cmd")
    if parser.has_option("zcnet", "server_port"):
        out["server_port"] = parser.getint("zcnet", "server_port")
    return out


_DURATION = re.compile(
    r"^P(?:(?P<w>\d+(?:\.\d+)?)W)?(?:(?P<d>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?$"
)


def seconds(iso):
    """Seconds in an ISO 8601 duration (`PT10S`, `P1DT2H`, `PT0.5S`)."""
    m = _DURATION.match(iso or "")
    if not m or iso in ("P", "PT"):
        raise ValueError(f"not an ISO 8601 duration: {iso!r}")
    f = {k: float(v) if v else 0.0 for k, v in m.groupdict().items()}
    return f["w"] * 604800 + f["d"] * 86400 + f["h"] * 3600 + f["m"] * 60 + f["s"]


def test_seconds(spec):
    return int(seconds(spec["duration"])) if spec.get("duration") else DEFAULT_DURATION


def setup_seconds(spec):
    """Time to set a test up: about a second per 50 ms of round trip, at least 4 s (the
    allowance pScheduler's iperf3 tool measured and uses)."""
    rtt = seconds(spec["link-rtt"]) if spec.get("link-rtt") else 0.2
    return max(4, int(rtt / 0.05 + 0.999))


def version(cmd):
    """`zcnet --version`'s version, or None where zcnet does not run."""
    try:
        out = subprocess.run([cmd, "--version"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = out.stdout.split()
    return words[-1] if out.returncode == 0 and words else None


def client_args(spec, port):
    """`zcnet bench -c …` for a throughput spec."""
    a = ["bench", "-c", spec["dest"], "-p", str(port), "-t", str(test_seconds(spec)), "-J"]
    if spec.get("interval"):
        a += ["-i", str(max(1, int(seconds(spec["interval"]))))]
    if spec.get("parallel"):
        a += ["-P", str(spec["parallel"])]
    if spec.get("udp"):
        a += ["-u"]
        if spec.get("bandwidth") is not None:
            a += ["-b", str(spec["bandwidth"])]
    if spec.get("buffer-length"):
        a += ["-l", str(spec["buffer-length"])]
    if spec.get("reverse"):
        a += ["-R"]
    if spec.get("zero-copy"):
        a += ["-Z"]
    if spec.get("no-delay"):
        a += ["-N"]
    return a


# iperf3's -J names → pScheduler's throughput result names.
_RENAME = {
    "socket": "stream-id",
    "start": "start",
    "end": "end",
    "bytes": "throughput-bytes",
    "bits_per_second": "throughput-bits",
    "omitted": "omitted",
    "jitter_ms": "jitter",
    "packets": "sent",
    "lost_packets": "lost",
    "retransmits": "retransmits",
    "snd_cwnd": "tcp-window-size",
    "rtt": "rtt",
    "mean_rtt": "rtt",
}


def rename(obj):
    return {_RENAME[k]: v for k, v in obj.items() if k in _RENAME}


def zcnet_diags(doc):
    """zcnet's figures from `end.zcnet`, as lines for `diags`."""
    z = doc.get("end", {}).get("zcnet") or {}
    lines = []
    for side in ("local", "remote"):
        s = z.get(side)
        if not s:
            continue
        share = s.get("zero_copy_share") or {}
        lines.append(
            "zcnet {} ({}): tx {} rx {}; cpu_s_per_gib {}; zero_copy_share tx {} rx {}".format(
                side, s.get("role"), ",".join(s.get("tx_paths_in_effect") or []),
                ",".join(s.get("rx_paths_in_effect") or []), s.get("cpu_s_per_gib"),
                share.get("tx"), share.get("rx")))
    if z.get("cpu_s_per_gib_both_ends") is not None:
        lines.append(f"zcnet both ends: cpu_s_per_gib {z['cpu_s_per_gib_both_ends']}")
    if z:
        lines.append("zcnet-json: " + json.dumps(z, sort_keys=True))
    return lines


def parse(stdout, diags):
    """A throughput result from `zcnet bench -J`'s document."""
    try:
        doc = json.loads(stdout)
    except ValueError as e:
        return {"succeeded": False, "error": f"zcnet bench -J output is not JSON: {e}",
                "diags": "\n".join(diags), "intervals": [], "summary": {}}
    if "error" in doc:
        return {"succeeded": False, "error": f"zcnet bench failed: {doc['error']}",
                "diags": "\n".join(diags), "intervals": [], "summary": {}}
    end = doc.get("end", {})
    intervals = [
        {"streams": [rename(s) for s in iv.get("streams", [])], "summary": rename(iv.get("sum", {}))}
        for iv in doc.get("intervals", [])
    ]
    total = end.get("sum_sent") or end.get("sum") or {}
    summary = rename(total)
    if "sum_received" in end:
        summary["receiver-throughput-bits"] = end["sum_received"].get("bits_per_second", 0)
    if "udp" in (end.get("streams") or [{}])[0] and "sum" in end:
        # UDP: the loss and jitter are the receiver's, in end.sum.
        for k in ("jitter_ms", "lost_packets"):
            summary[_RENAME[k]] = end["sum"].get(k)
    streams = []
    for s in end.get("streams", []):
        if "udp" in s:
            streams.append(rename(s["udp"]))
        elif "sender" in s:
            streams.append(rename(s["sender"]))
    return {
        "succeeded": True,
        "diags": "\n".join(diags + zcnet_diags(doc)),
        "intervals": intervals,
        "summary": {"streams": streams, "summary": summary},
    }


def sleep_until(iso_time):
    """Sleeps until an ISO 8601 time (`2026-12-02T01:30:00Z`); at once if it has passed."""
    when = datetime.datetime.fromisoformat(iso_time.replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    left = (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    if left > 0:
        time.sleep(left)
