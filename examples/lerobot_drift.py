#!/usr/bin/env python3
"""Which frames of a LeRobot dataset would LeRobot's own video lookup reject?

    python3 examples/lerobot_drift.py DATASET [--tolerance-s 1e-4]

LeRobot finds a frame at from_timestamp + timestamp and raises
FrameTimestampError when the nearest frame is more than tolerance_s away
(default 1e-4 s). In MP4s that hold several concatenated episodes, the real
start of each episode drifts past from_timestamp (mp4 durations are rounded
to milliseconds; upstream issue #3177), so those lookups fail. vlafeed maps
frames by ordinal instead. This prints, per camera file, each episode's drift
and how many of its frames LeRobot's lookup would reject. It reads only the
MP4 sample tables (no decoding), through the pure-Python reference in
tests/python/lerobot_reference.py.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
import lerobot_reference as R  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset")
    ap.add_argument("--tolerance-s", type=float, default=1e-4)
    args = ap.parse_args()
    meta = R.ReferenceMeta(args.dataset)
    total = rejected = 0
    bad_eps = set()
    for key in meta.camera_keys:
        files = sorted({meta.video_file(ep, key) for ep in meta.episodes if meta.video_file(ep, key).exists()})
        for path in files:
            video = R.VideoFile(path)
            cmap = R.CameraMap(meta, key, path, video)
            rel = path.relative_to(meta.root)
            print(f"{rel}: {len(video)} frames, {len(cmap.eps)} episodes, mapped by {cmap.method}")
            for ep in cmap.eps:
                e = int(ep["episode_index"])
                frm = meta.video_from_timestamp(ep, key)
                n_bad = 0
                for k in range(int(ep["length"])):
                    q = frm + float(R.np.float32(k / meta.fps))
                    j = video.nearest(q)
                    if abs(video.seconds[j] - q) > args.tolerance_s:
                        n_bad += 1
                total += int(ep["length"])
                rejected += n_bad
                if n_bad:
                    bad_eps.add(e)
                print(f"  episode {e:3d}: {ep['length']:4d} frames, drift {cmap.drift_ms[e]:6.3f} ms, "
                      f"LeRobot lookup rejects {n_bad}")
    print(f"LeRobot's lookup (tolerance {args.tolerance_s:g} s) rejects {rejected} of {total} camera frames "
          f"({len(bad_eps)} of {len(meta.episodes)} episodes affected); ordinal mapping reads them all.")


if __name__ == "__main__":
    main()
