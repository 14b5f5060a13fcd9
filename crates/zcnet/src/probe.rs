//! What this host can do, found by trying (placeholder until the probe lands).
