#!/usr/bin/env python3
"""random_access_bench.py: CPU per item of map-style random access,
vlafeed.LeRobotDataset against upstream LeRobot 0.6's LeRobotDataset on its
torchcodec backend, both at one thread, on the same shuffled positions.

    python3 bench/random_access_bench.py [--size 320x240]   (after make py-inplace)
        [--episodes 20] [--items 400] [--warmup 40] [--codecs h264,mpeg4,av1] [--repeat 2]
        [--out bench/random-access]

Data: `vlafeed make-sample` with LeRobot's recorder settings (GOP 2, crf 30;
AV1 libsvtav1 preset 12 with fast-decode=0, H.264 libx264 default preset:
lerobot/configs/video.py VideoEncoderConfig), 2 cameras. MPEG-4 Part 2: the
H.264 files re-encoded by the ffmpeg CLI with `-c:v mpeg4 -g 2` (LeRobot's
g; its crf is no mpeg4 option), every pts kept.

Cases per codec: `single` (no delta_timestamps: one frame per camera) and
`window8` (delta_timestamps on both cameras, 8 consecutive frames
[-7/fps .. 0]: 16 frames per item). The tolerance is 0.45/fps on both sides
(LeRobot's 1e-4 rejects later episodes of concatenated files, #3177; it
changes no decoding work).

Both sides run in their own process (bench/peers/random_access.py): vlafeed
in this environment, LeRobot with build-lerobot/venv312/bin/python (or
$VF_LEROBOT_PYTHON). Each process prints and records its thread settings.
Writes OUT.md (the table) and OUT.json (every number).
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import _inplace  # noqa: E402  (the in-place build for the vlafeed side, when there is one)


def make_datasets(cli, work, size, episodes, codecs):
    roots = {}
    for codec in codecs:
        root = work / codec
        if (root / "meta" / "info.json").is_file():
            roots[codec] = root
            continue
        base = codec if codec != "mpeg4" else "h264"
        src = work / base
        if not (src / "meta" / "info.json").is_file():
            subprocess.run([cli, "make-sample", str(src), "--codec", base, "--episodes", str(episodes), "--cameras",
                            "2", "--size", size, "--gop", "2", "--crf", "30", "--quiet"], check=True)
        if codec == "mpeg4":
            subprocess.run(["cp", "-r", str(src), str(root)], check=True)
            for mp4 in sorted((root / "videos").rglob("*.mp4")):
                tmp = mp4.with_suffix(".tmp.mp4")
                subprocess.run(["ffmpeg", "-v", "error", "-y", "-i", str(mp4), "-c:v", "mpeg4", "-g", "2",
                                "-vsync", "passthrough", "-enc_time_base", "-1", "-video_track_timescale", "15360",
                                str(tmp)], check=True)
                tmp.replace(mp4)
        roots[codec] = root
    return roots


def run_side(side, python, requests, work):
    req, out = work / f"requests-{side}.json", work / f"result-{side}.json"
    req.write_text(json.dumps(requests))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if side == "vlafeed":
        env = _inplace.child_env(env)
    subprocess.run([python, str(HERE / "peers" / "random_access.py"), side, str(req), str(out)], check=True, env=env)
    return json.loads(out.read_text())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="320x240")
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--items", type=int, default=400, help="measured items per case")
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--codecs", default="h264,mpeg4,av1")
    ap.add_argument("--cases", default="single,window8")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=2,
                    help="run the two sides alternately this many times; each case keeps each side's lowest "
                         "CPU per item (the least disturbed run on a shared machine)")
    ap.add_argument("--work", help="dataset folder (kept; default: a temporary one)")
    ap.add_argument("--out", default=str(HERE / "random-access"), help="OUT.md and OUT.json")
    ap.add_argument("--cli", default=os.environ.get("VF_CLI", str(ROOT / "build" / "vlafeed")))
    ap.add_argument("--lerobot-python", default=os.environ.get("VF_LEROBOT_PYTHON",
                                                               str(ROOT / "build-lerobot" / "venv312" / "bin" / "python")))
    a = ap.parse_args(argv)
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="vlafeed-random-access-"))
    work.mkdir(parents=True, exist_ok=True)
    codecs = a.codecs.split(",")
    roots = make_datasets(a.cli, work, a.size, a.episodes, codecs)

    info = json.loads((roots[codecs[0]] / "meta" / "info.json").read_text())
    fps = float(info["fps"])
    cameras = [k for k, v in info["features"].items() if v.get("dtype") == "video"]
    total = int(info["total_frames"])
    rng = random.Random(a.seed)
    positions = [rng.randrange(total) for _ in range(a.warmup + a.items)]
    window = [(k - 7) / fps for k in range(8)]
    cases = []
    for codec in codecs:
        for mode in a.cases.split(","):
            cases.append({"name": f"{codec}-{mode}", "codec": codec, "mode": mode, "root": str(roots[codec]),
                          "deltas": {c: window for c in cameras} if mode == "window8" else None,
                          "tolerance_s": 0.45 / fps, "positions": positions, "warmup": a.warmup})
    requests = {"threads": 1, "cases": cases}
    runs = {"vlafeed": [], "lerobot": []}
    for _ in range(max(1, a.repeat)):
        for side, py in (("vlafeed", sys.executable), ("lerobot", a.lerobot_python)):
            runs[side].append(run_side(side, py, requests, work))
    results = {}
    for side, docs in runs.items():
        best = dict(docs[0], cases={})
        for case in cases:
            best["cases"][case["name"]] = min((d["cases"][case["name"]] for d in docs),
                                              key=lambda c: c["cpu_ms_per_item"])
            best["cases"][case["name"]]["cpu_ms_per_item_runs"] = [d["cases"][case["name"]]["cpu_ms_per_item"]
                                                                   for d in docs]
        results[side] = best
    for side in results:
        print(f"{side} thread settings: {json.dumps(results[side]['threads'])}")

    rows = []
    for case in cases:
        v, l = results["vlafeed"]["cases"][case["name"]], results["lerobot"]["cases"][case["name"]]
        same = abs(v["last_item_pixel_sum"] - l["last_item_pixel_sum"]) <= 1e-6 * max(1.0, abs(l["last_item_pixel_sum"]))
        rows.append({"case": case["name"], "codec": case["codec"], "mode": case["mode"], "items": v["items"],
                     "vlafeed_cpu_ms": v["cpu_ms_per_item"], "lerobot_cpu_ms": l["cpu_ms_per_item"],
                     "ratio_cpu": l["cpu_ms_per_item"] / v["cpu_ms_per_item"],
                     "vlafeed_wall_ms": v["wall_ms_per_item"], "lerobot_wall_ms": l["wall_ms_per_item"],
                     "last_item_same_pixels": same})
    frames = info["features"][cameras[0]]["shape"]
    doc = {"schema": "vlafeed-random-access/1", "size": a.size, "episodes": a.episodes, "total_frames": total,
           "fps": fps, "cameras": len(cameras), "frame_shape": frames, "items": a.items, "warmup": a.warmup,
           "seed": a.seed, "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + (argv or sys.argv[1:])),
           "threads": {s: results[s]["threads"] for s in results}, "rows": rows,
           "repeat": a.repeat, "raw": results, "machine": {"cores": os.cpu_count(), "loadavg": list(os.getloadavg())}}
    out = Path(a.out)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=2))
    lines = [f"| case | vlafeed CPU-ms/item | LeRobot torchcodec CPU-ms/item | ratio (CPU) | vlafeed wall-ms | "
             f"LeRobot wall-ms | last item same pixels |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['vlafeed_cpu_ms']:.3f} | {r['lerobot_cpu_ms']:.3f} | "
                     f"**{r['ratio_cpu']:.2f}x** | {r['vlafeed_wall_ms']:.3f} | {r['lerobot_wall_ms']:.3f} | "
                     f"{'yes' if r['last_item_same_pixels'] else 'NO'} |")
    table = "\n".join(lines)
    print(table)
    out.with_suffix(".md").write_text(
        f"# Random access: vlafeed vs LeRobot torchcodec, 1 thread\n\n"
        f"`{doc['command']}`; {len(cameras)} cameras {a.size}, {total} frames, {a.items} shuffled positions "
        f"per case after {a.warmup} warm-up ones, `ds[i]` one at a time, float32 [C,H,W]; each side run "
        f"{a.repeat}x alternately, the lowest CPU per item kept (all runs in the JSON).\n\n"
        f"Threads: vlafeed {json.dumps(results['vlafeed']['threads'])}; "
        f"LeRobot {json.dumps(results['lerobot']['threads'])}.\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
