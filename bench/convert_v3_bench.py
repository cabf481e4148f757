#!/usr/bin/env python3
"""v2.1 -> v3.0 conversion speed: `vlafeed convert --to lerobot-v3` against
upstream LeRobot's own converter (lerobot.datasets.v30.convert_dataset_v21_to_v30,
LeRobot 0.4.4 in build-lerobot/venv) on the same dataset, in the same run.

1. The source: by default the real LeRobot v2.1 fixture's episodes that
   have videos (G1: AV1 640x480 30 fps as LeRobot encoded them, ~3.4 MB
   per episode) replicated into a v2.1 dataset of --episodes episodes
   (data rows renumbered, MP4s copied as they are); with --synthetic a
   make-sample dataset moved into the v2.1 layout (tests/python/v21_sample.py);
   or --source DIR.
2. Times `vlafeed convert SRC OUT --to lerobot-v3` (--repeat runs, best and
   median), reporting episodes/s and MB/s of source read.
3. Times LeRobot's convert_dataset(repo_id, root=..., push_to_hub=False) on a
   copy (it moves folders around), when the venv exists.
4. Runs `vlafeed decode-check` on both outputs and reports the largest
   |first pts - from_timestamp| (LeRobot's concatenation drift; 0 for
   vlafeed) and whether every episode maps exactly.

usage: bench/convert_v3_bench.py [--episodes 100] [--fixture DIR | --synthetic | --source DIR]
                                 [--keep DIR] [--repeat 3]
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))


def tree_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / (1024 * 1024)


def replicate_fixture(fixture: Path, out: Path, episodes: int):
    """A v2.1 dataset of `episodes` episodes cycling over the fixture's
    episodes that have every video file."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    info = json.loads((fixture / "meta/info.json").read_text())
    keys = [k for k, f in info["features"].items() if f["dtype"] == "video"]
    rows = [json.loads(x) for x in (fixture / "meta/episodes.jsonl").read_text().splitlines() if x.strip()]
    stats = {json.loads(x)["episode_index"]: json.loads(x)["stats"]
             for x in (fixture / "meta/episodes_stats.jsonl").read_text().splitlines() if x.strip()}
    have = [r for r in rows if all((fixture / f"videos/chunk-000/{k}/episode_{r['episode_index']:06d}.mp4").exists()
                                   for k in keys)]
    (out / "meta").mkdir(parents=True)
    index = 0
    ep_lines, st_lines = [], []
    for e in range(episodes):
        base = have[e % len(have)]
        b = base["episode_index"]
        chunk = e // info["chunks_size"]
        t = pq.read_table(fixture / f"data/chunk-000/episode_{b:06d}.parquet")
        n = t.num_rows
        t = t.set_column(t.column_names.index("episode_index"), "episode_index", pa.array([e] * n, pa.int64()))
        t = t.set_column(t.column_names.index("index"), "index", pa.array(range(index, index + n), pa.int64()))
        dst = out / f"data/chunk-{chunk:03d}/episode_{e:06d}.parquet"
        dst.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(t, dst)
        for k in keys:
            v = out / f"videos/chunk-{chunk:03d}/{k}/episode_{e:06d}.mp4"
            v.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(fixture / f"videos/chunk-000/{k}/episode_{b:06d}.mp4", v)
        ep_lines.append(json.dumps({"episode_index": e, "tasks": base["tasks"], "length": n}))
        st_lines.append(json.dumps({"episode_index": e, "stats": stats[b]}))
        index += n
    (out / "meta/episodes.jsonl").write_text("\n".join(ep_lines) + "\n")
    (out / "meta/episodes_stats.jsonl").write_text("\n".join(st_lines) + "\n")
    shutil.copyfile(fixture / "meta/tasks.jsonl", out / "meta/tasks.jsonl")
    info.update(total_episodes=episodes, total_frames=index, total_videos=episodes * len(keys),
                total_chunks=(episodes - 1) // info["chunks_size"] + 1, splits={"train": f"0:{episodes}"})
    (out / "meta/info.json").write_text(json.dumps(info, indent=4))


def drift_report(cli, root: Path) -> dict:
    r = subprocess.run([cli, "decode-check", str(root), "--no-decode", "--json"], capture_output=True, text=True)
    doc = json.loads(r.stdout)
    drifts = [abs(e["drift_ms"]) for c in doc["cameras"] for f in c["files"] for e in f["episodes"]
              if e.get("drift_ms") is not None]
    return {"errors": doc["errors"], "max_drift_ms": max(drifts) if drifts else None,
            "files": sum(len(c["files"]) for c in doc["cameras"])}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--cameras", type=int, default=2)
    ap.add_argument("--size", default="320x240")
    ap.add_argument("--min-length", type=int, default=40)
    ap.add_argument("--max-length", type=int, default=100)
    ap.add_argument("--source", help="an existing v2.1 dataset to convert instead")
    ap.add_argument("--fixture", default=str(ROOT.parent / "shared" / "fixtures" / "lerobot-g1-v21"))
    ap.add_argument("--synthetic", action="store_true", help="make-sample episodes instead of the fixture's")
    ap.add_argument("--keep", help="work folder to keep (default: a temporary one)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--lerobot-python", default=os.environ.get("VF_LEROBOT_PYTHON")
                    or str(ROOT / "build-lerobot" / "venv" / "bin" / "python"))
    args = ap.parse_args()
    cli = str(Path(args.build) / "vlafeed")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="vf-convert-bench-"))
    work.mkdir(parents=True, exist_ok=True)

    if args.source:
        src = Path(args.source)
    elif not args.synthetic and Path(args.fixture).is_dir():
        src = work / "v21"
        if not (src / "meta/info.json").exists():
            replicate_fixture(Path(args.fixture), src, args.episodes)
    else:
        src = work / "v21"
        if not (src / "meta/info.json").exists():
            from v21_sample import make_v21
            t = time.perf_counter()
            make_v21(cli, src, episodes=args.episodes, cameras=args.cameras, size=args.size,
                     min_length=args.min_length, max_length=args.max_length, seed=1)
            print(f"made the v2.1 source in {time.perf_counter() - t:.1f} s")
    info = json.loads((src / "meta/info.json").read_text())
    src_mb = tree_mb(src)
    print(f"source: {src} ({info['total_episodes']} episodes, {info['total_frames']} frames, {src_mb:.1f} MB)")

    times, cpus = [], []
    out = work / "vlafeed-v30"
    summary = None
    for _ in range(args.repeat):
        shutil.rmtree(out, ignore_errors=True)
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        r = subprocess.run([cli, "convert", str(src), str(out), "--to", "lerobot-v3", "--json", "--quiet"],
                           capture_output=True, text=True)
        times.append(time.perf_counter() - t)
        ru2 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(ru2.ru_utime - ru.ru_utime + ru2.ru_stime - ru.ru_stime)
        if r.returncode != 0:
            sys.exit(r.stderr)
        summary = json.loads(r.stdout)
    best, med = min(times), statistics.median(times)
    eps = info["total_episodes"]
    result = {"source_mb": round(src_mb, 2), "episodes": eps, "frames": info["total_frames"],
              "vlafeed": {"best_s": round(best, 3), "median_s": round(med, 3), "episodes_per_s": round(eps / best, 1),
                          "mb_per_s": round(src_mb / best, 1), "cpu_s": round(min(cpus), 3),
                          "mb_per_cpu_s": round(src_mb / min(cpus), 1), "data_files": summary["data_files"],
                          "video_files": summary["video_files"], **drift_report(cli, out)}}
    print(f"vlafeed convert: best {best:.3f} s, median {med:.3f} s over {len(times)} runs: "
          f"{eps / best:.1f} episodes/s, {src_mb / best:.1f} MB/s; {min(cpus):.3f} CPU-s "
          f"({src_mb / min(cpus):.1f} MB per CPU-second)")

    if os.path.isfile(args.lerobot_python):
        lr_parent = work / "lerobot"
        shutil.rmtree(lr_parent, ignore_errors=True)
        shutil.copytree(src, lr_parent / "ds")
        code = ("import sys, time, types, logging\n"
                "sys.modules.setdefault('torchvision._meta_registrations', types.ModuleType('x'))\n"
                "from lerobot.datasets.v30.convert_dataset_v21_to_v30 import convert_dataset\n"
                "t = time.perf_counter(); c = time.process_time()\n"
                f"convert_dataset('ds', root={str(lr_parent)!r}, push_to_hub=False)\n"
                "print(time.perf_counter() - t, time.process_time() - c)\n")
        env = dict(os.environ, HF_HOME=str(work / "hf-home"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
        t = time.perf_counter()
        r = subprocess.run([args.lerobot_python, "-c", code], capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t
        if r.returncode != 0:
            print("LeRobot's converter failed:", r.stderr[-2000:])
        else:
            inner, inner_cpu = map(float, r.stdout.strip().splitlines()[-1].split())
            lr = {"convert_s": round(inner, 3), "process_s": round(wall, 3), "episodes_per_s": round(eps / inner, 1),
                  "mb_per_s": round(src_mb / inner, 1), "cpu_s": round(inner_cpu, 3),
                  "mb_per_cpu_s": round(src_mb / inner_cpu, 1), **drift_report(cli, lr_parent / "ds")}
            result["lerobot"] = lr
            result["speedup"] = round(inner / best, 1)
            result["speedup_per_cpu_s"] = round(inner_cpu / min(cpus), 1)
            print(f"LeRobot convert_dataset: {inner:.3f} s ({wall:.1f} s with imports): {eps / inner:.1f} "
                  f"episodes/s, {src_mb / inner:.1f} MB/s, {inner_cpu:.3f} CPU-s -> vlafeed is {inner / best:.1f}x "
                  f"faster in wall time, {inner_cpu / min(cpus):.1f}x per CPU-second")
            print(f"drift after conversion: vlafeed {result['vlafeed']['max_drift_ms']} ms, "
                  f"LeRobot {lr['max_drift_ms']} ms (max |first pts - from_timestamp|)")
    else:
        print(f"no LeRobot venv at {args.lerobot_python}: LeRobot's converter not run")
    print(json.dumps(result, indent=2))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
