#!/usr/bin/env python3
"""compare.py: the standard vlafeed benchmark in one command.

    python3 bench/compare.py [--out DIR] [--quick] [--no-peers] [--no-lerobot] [--no-torchrun]

1. Makes the standard dataset once (kept in DIR/data): `vlafeed make-sample`
   AV1 (libsvtav1), 3 cameras, 640x480, 30 fps, LeRobot's encoding defaults
   (GOP 2, crf 30), 3 base episodes of 12-16 s, replicated 10x by
   bench/replicate_dataset.py into 30 episodes / 13,820 frames, one MP4 per
   camera (as LeRobot lays out a dataset of this size): 216 batches of 64 in
   single mode without wrapping. Generation takes ~3 CPU-minutes.
2. Runs `vlafeed bench` (C, no Python in the loop) for every loader (stream,
   map, and pool when the build has it) in single mode (batch 64) and sarm
   mode (batch 8: 8 samples x 8 steps x 3 cameras = 192 frames, 0.7 GB of
   float32 per batch), each with --with-limit (the raw decode + RGB
   conversion of the same files with the same threads, in the same run).
3. Runs the peers for the same modes: the LeRobot-style PyAV loader behind a
   torch DataLoader (batch 8, 0 and 2 workers; PyAV's default decoder
   threading and a tuned one-thread variant; sarm with LeRobot's span decode
   and a per-frame variant), and upstream LeRobot 0.4.4's LeRobotDataset and
   StreamingLeRobotDataset when the isolated venv exists (build-lerobot/venv,
   tests/python/install_lerobot.sh); each peer runs --peer-seconds after its
   first batch.
4. bench/torchrun_bench.py with 1 and 2 ranks (map, single): frames/s per
   node summed over ranks; and a pool-size sweep (1, 4, 16, 30 episodes,
   uint8 batches) of peak RSS.
5. Prints the table of figures and ratios (vlafeed / limit, vlafeed / best
   peer), writes DIR/summary.json and DIR/summary.md, and DIR/bench.png
   (bench/plot_bench.py) when matplotlib is installed.

Figures are wall clock AND per CPU-second: on a shared machine the second is
the stable one. Every JSON records the load before its run.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time

import _inplace  # bench/_inplace.py: the in-place build if there is one, else the installed package

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

BASE = dict(episodes=3, cameras=3, size="640x480", fps=30, codec="av1", gop=2, crf=30, min_length=360,
            max_length=480, seed=0)
COPIES = 10


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def find_cli():
    for c in (os.environ.get("VF_CLI"), os.path.join(ROOT, "build", "vlafeed"), shutil.which("vlafeed")):
        if c and os.path.exists(c):
            return c
    raise SystemExit("compare: the vlafeed command is not built (cmake --build build) and VF_CLI is not set")


def lerobot_python():
    p = os.environ.get("VF_LEROBOT_PYTHON") or os.path.join(ROOT, "build-lerobot", "venv", "bin", "python")
    return p if os.path.exists(p) else None


def make_dataset(cli, data_dir):
    base = os.path.join(data_dir, "base")
    std = os.path.join(data_dir, "std")
    info = os.path.join(std, "meta", "info.json")
    if os.path.exists(info):
        return std, None
    os.makedirs(data_dir, exist_ok=True)
    t0 = time.monotonic()
    if not os.path.exists(os.path.join(base, "meta", "info.json")):
        shutil.rmtree(base, ignore_errors=True)
        b = BASE
        log(f"compare: writing the base dataset ({b['episodes']} episodes x {b['cameras']} cameras, {b['size']} "
            f"{b['codec']}, GOP {b['gop']}, crf {b['crf']}; a few minutes)...")
        subprocess.run([cli, "make-sample", base, "--episodes", str(b["episodes"]), "--cameras", str(b["cameras"]),
                        "--size", b["size"], "--fps", str(b["fps"]), "--codec", b["codec"], "--gop", str(b["gop"]),
                        "--crf", str(b["crf"]), "--min-length", str(b["min_length"]),
                        "--max-length", str(b["max_length"]), "--seed", str(b["seed"])], check=True)
    shutil.rmtree(std, ignore_errors=True)
    sys.path.insert(0, HERE)
    import replicate_dataset
    replicate_dataset.replicate(base, std, COPIES, "concat")
    return std, time.monotonic() - t0


def run_vlafeed(cli, dataset, out, mode, loader, batch, batches, threads, extra=()):
    cmd = [cli, "bench", dataset, "--mode", mode, "--loader", loader, "--batch-size", str(batch), "--num-batches",
           str(batches), "--with-limit", "--out-dir", out, "--json", "--quiet"]
    if threads:
        cmd += ["--threads", str(threads)]
    cmd += list(extra)
    log("compare: " + " ".join(cmd[1:]))
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        msg = (p.stderr.strip().splitlines() or ["failed"])[-1]
        log(f"compare:   skipped: {msg}")
        return None, msg
    return json.loads(p.stdout), None


def run_peer(cmd, out):
    log("compare: " + " ".join(os.path.basename(c) if i < 2 else c for i, c in enumerate(cmd)))
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    p = subprocess.run(cmd + ["--out-dir", out], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        tail = [l for l in p.stderr.strip().splitlines() if l.strip()][-1:] or ["failed"]
        log(f"compare:   failed: {tail[0]}")
        return None, tail[0]
    line = p.stdout.strip().splitlines()[-1]
    log("compare:   " + line)
    path = line.rsplit("-> ", 1)[-1].strip()
    with open(path) as f:
        return json.load(f), None


def fmt(v, digits=1):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench"), help="results folder (default build/bench)")
    ap.add_argument("--threads", type=int, default=0, help="engine threads (default: cores)")
    ap.add_argument("--num-batches", type=int, default=200, help="single mode batches of 64 (default 200)")
    ap.add_argument("--sarm-batches", type=int, default=100, help="sarm mode batches of 8 (default 100)")
    ap.add_argument("--peer-seconds", type=float, default=30.0, help="each peer's run after its first batch")
    ap.add_argument("--quick", action="store_true", help="60 / 30 batches, 10 s peers")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--no-lerobot", action="store_true", help="skip upstream LeRobot even if its venv exists")
    ap.add_argument("--no-torchrun", action="store_true", help="skip bench/torchrun_bench.py (1 and 2 ranks)")
    ap.add_argument("--no-pool-memory", action="store_true", help="skip the pool-size memory sweep")
    ap.add_argument("--loaders", default="stream,map,pool")
    a = ap.parse_args(argv)
    if a.quick:
        a.num_batches, a.sarm_batches, a.peer_seconds = 60, 30, 10.0

    cli = find_cli()
    out = os.path.abspath(a.out)
    res_dir = os.path.join(out, "results")
    shutil.rmtree(res_dir, ignore_errors=True)
    os.makedirs(res_dir)
    dataset, gen_s = make_dataset(cli, os.path.join(out, "data"))
    load0 = os.getloadavg()
    t_start = time.monotonic()

    runs, skipped = {}, {}
    loaders = [l for l in a.loaders.split(",") if l]
    for loader in loaders:
        for mode, batch, batches in (("single", 64, a.num_batches), ("sarm", 8, a.sarm_batches)):
            doc, why = run_vlafeed(cli, dataset, res_dir, mode, loader, batch, batches, a.threads)
            key = f"vlafeed-{loader}-{mode}"
            if doc:
                runs[key] = doc
            else:
                skipped[key] = why

    if not a.no_peers:
        py = sys.executable
        pyav = os.path.join(HERE, "peers", "pyav_peer.py")
        secs = ["--seconds", str(a.peer_seconds)]
        peer_cmds = [
            [py, pyav, dataset, "--mode", "single", "--workers", "0"] + secs,
            [py, pyav, dataset, "--mode", "single", "--workers", "2"] + secs,
            [py, pyav, dataset, "--mode", "single", "--workers", "2", "--decoder-threads", "1"] + secs,
            [py, pyav, dataset, "--mode", "sarm", "--workers", "2", "--window", "span"] + secs,
            [py, pyav, dataset, "--mode", "sarm", "--workers", "2", "--window", "per-frame",
             "--decoder-threads", "1"] + secs,
        ]
        lpy = None if a.no_lerobot else lerobot_python()
        if lpy:
            lr = os.path.join(HERE, "peers", "lerobot_peer.py")
            peer_cmds += [
                [lpy, lr, dataset, "--dataset", "map", "--mode", "single", "--workers", "0"] + secs,
                [lpy, lr, dataset, "--dataset", "map", "--mode", "single", "--workers", "2"] + secs,
                [lpy, lr, dataset, "--dataset", "map", "--mode", "sarm", "--workers", "2"] + secs,
                [lpy, lr, dataset, "--dataset", "streaming", "--mode", "single", "--workers", "0"] + secs,
                [lpy, lr, dataset, "--dataset", "streaming", "--mode", "sarm", "--workers", "0"] + secs,
            ]
        else:
            skipped["lerobot"] = ("upstream LeRobot venv not found (tests/python/install_lerobot.sh builds "
                                  "build-lerobot/venv; set VF_LEROBOT_PYTHON for another)")
        for cmd in peer_cmds:
            doc, why = run_peer(cmd, res_dir)
            if doc:
                runs[doc["config"]] = doc
            else:
                skipped[os.path.basename(cmd[1]) + " " + " ".join(cmd[3:7])] = why

    pool_memory = []
    if "pool" in loaders and not a.no_pool_memory and "vlafeed-pool-single" in runs:
        # Peak RSS against the pool size (uint8 batches, so batch buffers do not hide the rest).
        for size in (1, 4, 16, 30):
            doc, why = run_vlafeed(cli, dataset, os.path.join(out, "pool-memory"), "single", "pool", 64,
                                   max(20, a.num_batches // 6), a.threads,
                                   ["--pool-size", str(size), "--format", "uint8", "--name", f"pool-{size}"])
            if doc:
                r = doc["results"]
                pool_memory.append({"pool_size": size, "peak_rss_mb": r["peak_rss_mb"],
                                    "rss_after_open_mb": r["rss_after_open_mb"],
                                    "batch_buffers_mb": r["batch_buffers"] * r["batch_bytes"] / 2 ** 20,
                                    "decoders_open": r["decoder_cache"]["size"],
                                    "decoder_cache_capacity": r["decoder_cache"]["capacity"],
                                    "frames_per_cpu_s": r["frames_per_cpu_s"]})

    if not a.no_torchrun:
        for n in (1, 2):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
                   os.path.join(HERE, "torchrun_bench.py"), dataset, "--mode", "single", "--loader", "map",
                   "--num-batches", str(max(20, a.num_batches // 2)), "--out-dir", res_dir]
            log("compare: " + " ".join(cmd[2:]))
            p = subprocess.run(cmd, capture_output=True, text=True, env=_inplace.child_env())
            path = os.path.join(res_dir, f"torchrun-single-map-n{n}.json")
            if p.returncode == 0 and os.path.exists(path):
                with open(path) as f:
                    runs[f"torchrun-n{n}"] = json.load(f)
            else:
                skipped[f"torchrun-n{n}"] = (p.stderr.strip().splitlines() or ["failed"])[-1]

    summary = summarize(runs, skipped, dataset, gen_s, load0, time.monotonic() - t_start)
    summary["pool_memory"] = pool_memory
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    text = render(summary)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    print(text)
    try:
        subprocess.run([sys.executable, os.path.join(HERE, "plot_bench.py"), res_dir, "--out",
                        os.path.join(out, "bench.png")], check=True, capture_output=True, text=True)
        print(f"chart: {os.path.join(out, 'bench.png')}")
    except subprocess.CalledProcessError as e:
        print(f"chart: not drawn ({(e.stderr.strip().splitlines() or ['plot failed'])[-1]})")
    return 0


def best_peer(runs, prefix, mode, key):
    """The peer run of this family and mode with the highest figure (the
    conservative denominator)."""
    cands = [d for name, d in runs.items() if name.startswith(prefix) and d["settings"].get("mode") == mode
             and d["results"].get(key)]
    return max(cands, key=lambda d: d["results"][key]) if cands else None


def summarize(runs, skipped, dataset, gen_s, load0, total_s):
    rows = []
    for name, d in runs.items():
        r = d["results"]
        rows.append({
            "run": d["config"], "kind": "vlafeed" if name.startswith("vlafeed") else "torchrun"
            if name.startswith("torchrun") else "peer",
            "mode": d["settings"].get("mode"), "loader": d["settings"].get("loader"),
            "batch": d["settings"].get("batch_size"), "frames_per_s": r.get("frames_per_s_node"),
            "frames_per_cpu_s": r.get("frames_per_cpu_s"), "samples_per_s": r.get("samples_per_s"),
            "first_batch_s": r.get("first_batch_latency_s"), "decoded_per_emitted": r.get("decoded_per_emitted"),
            "peak_rss_mb": r.get("peak_rss_mb"),
            "steady_frames_per_s": (r.get("steady_state") or {}).get("frames_per_s_node"),
            "steady_frames_per_cpu_s": (r.get("steady_state") or {}).get("frames_per_cpu_s"),
            "load_before": (d.get("machine") or {}).get("loadavg_before", [None])[0],
        })
    ratios = []
    for name, d in runs.items():
        if not name.startswith("vlafeed"):
            continue
        r, mode = d["results"], d["settings"]["mode"]
        row = {"run": d["config"], "mode": mode}
        if d.get("ratios"):
            lim = d["limit"]
            row["limit"] = f"{lim['kind']} decode, {lim['threads']} threads"
            row["vs_limit_wall"] = d["ratios"]["loader_vs_limit_wall"]
            row["vs_limit_cpu"] = d["ratios"]["loader_vs_limit_cpu"]
        for fam, label in (("peer-pyav", "pyav"), ("peer-lerobot-map", "lerobot"),
                           ("peer-lerobot-streaming", "lerobot_streaming")):
            pw = best_peer(runs, fam, mode, "frames_per_s_node")
            pc = best_peer(runs, fam, mode, "frames_per_cpu_s")
            if pw:
                row[f"vs_{label}_wall"] = r["frames_per_s_node"] / pw["results"]["frames_per_s_node"]
                row[f"{label}_wall_peer"] = pw["config"]
            if pc:
                row[f"vs_{label}_cpu"] = r["frames_per_cpu_s"] / pc["results"]["frames_per_cpu_s"]
                row[f"{label}_cpu_peer"] = pc["config"]
        ratios.append(row)
    try:
        cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
        model = next((l.split(":", 1)[1].strip() for l in cpu if l.startswith("Model name")), "?")
    except OSError:
        model = "?"
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) // 1024
    return {"dataset": dataset, "dataset_generation_s": gen_s, "machine": {
        "cores": os.cpu_count(), "cpu_model": model, "mem_total_mb": mem, "loadavg_at_start": list(load0)},
        "total_s": total_s, "rows": rows, "ratios": ratios, "skipped": skipped}


def targets(s):
    out = []
    by = {r["run"]: r for r in s["ratios"]}
    steady = {r["run"]: r for r in s["rows"]}

    def get(prefix):
        return [r for name, r in by.items() if name.startswith(prefix)]

    def verdict(values, goal):
        vals = [v for v in values if v is not None]
        if not vals:
            return "not measured"
        return "holds" if min(vals) >= goal else ("misses" if max(vals) < goal else "holds on one figure")

    for r in get("single-stream"):
        lim_cpu = r.get("vs_limit_cpu")
        st = steady.get(r["run"], {})
        steady_ratio = None
        if st.get("steady_frames_per_cpu_s") and lim_cpu:
            steady_ratio = st["steady_frames_per_cpu_s"] / (st["frames_per_cpu_s"] / lim_cpu)
        out.append(f"- stream >= 0.9 x sequential decode limit: {fmt(r.get('vs_limit_wall'), 2)} / "
                   f"{fmt(lim_cpu, 2)} (steady state per CPU-s {fmt(steady_ratio, 2)}): "
                   f"{verdict([r.get('vs_limit_wall'), lim_cpu], 0.9)}")
    for prefix in ("single-map", "single-pool"):
        for r in get(prefix):
            out.append(f"- {r['run']} >= 0.8 x random-access decode limit: {fmt(r.get('vs_limit_wall'), 2)} / "
                       f"{fmt(r.get('vs_limit_cpu'), 2)}: {verdict([r.get('vs_limit_wall'), r.get('vs_limit_cpu')], 0.8)}")
            out.append(f"- {r['run']} >= 3 x PyAV peer: {fmt(r.get('vs_pyav_wall'), 2)} / "
                       f"{fmt(r.get('vs_pyav_cpu'), 2)} (best peers: {r.get('pyav_wall_peer')} / "
                       f"{r.get('pyav_cpu_peer')}): {verdict([r.get('vs_pyav_wall'), r.get('vs_pyav_cpu')], 3)}")
    for r in get("sarm-"):
        out.append(f"- {r['run']} >= 4 x PyAV peer: {fmt(r.get('vs_pyav_wall'), 2)} / {fmt(r.get('vs_pyav_cpu'), 2)}"
                   f" (best peers: {r.get('pyav_wall_peer')} / {r.get('pyav_cpu_peer')}): "
                   f"{verdict([r.get('vs_pyav_wall'), r.get('vs_pyav_cpu')], 4)}")
    pm = s.get("pool_memory") or []
    if len(pm) >= 2:
        lo, hi = pm[0], pm[-1]
        out.append(f"- pool memory: pool {lo['pool_size']} -> {hi['pool_size']} episodes: peak RSS "
                   f"{fmt(lo['peak_rss_mb'], 0)} -> {fmt(hi['peak_rss_mb'], 0)} MB (batch buffers "
                   f"{fmt(hi['batch_buffers_mb'], 0)} MB; decoders open {lo['decoders_open']} -> "
                   f"{hi['decoders_open']}, capped at {hi['decoder_cache_capacity']}); no decoded frames are held "
                   f"by the pool")
    return out


def render(s):
    m = s["machine"]
    lines = [f"# vlafeed benchmark ({m['cores']} cores, {m['cpu_model']}, {m['mem_total_mb']} MB; load "
             f"{m['loadavg_at_start'][0]:.2f} at start; {s['total_s'] / 60:.1f} min)", "",
             f"dataset: {s['dataset']}", "",
             "| run | mode | batch | frames/s | frames/CPU-s | steady frames/s | steady frames/CPU-s | samples/s | "
             "first batch s | decoded/emitted | peak RSS MB | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(s["rows"], key=lambda r: (r["mode"] or "", r["kind"] != "vlafeed", r["run"])):
        lines.append(f"| {r['run']} | {r['mode']} | {fmt(r['batch'])} | {fmt(r['frames_per_s'])} | "
                     f"{fmt(r['frames_per_cpu_s'])} | {fmt(r['steady_frames_per_s'])} | "
                     f"{fmt(r['steady_frames_per_cpu_s'])} | {fmt(r['samples_per_s'])} | "
                     f"{fmt(r['first_batch_s'], 2)} | {fmt(r['decoded_per_emitted'], 2)} | "
                     f"{fmt(r['peak_rss_mb'], 0)} | {fmt(r['load_before'], 2)} |")
    lines += ["", "Ratios (wall clock / per CPU-second; peers: the best of their variants for that figure):", "",
              "| vlafeed run | vs decode limit | vs PyAV peer | vs LeRobotDataset | vs StreamingLeRobotDataset |",
              "|---|---|---|---|---|"]

    def pair(row, key):
        w, c = row.get(f"vs_{key}_wall"), row.get(f"vs_{key}_cpu")
        return "-" if w is None and c is None else f"{fmt(w, 2)} / {fmt(c, 2)}"
    for row in sorted(s["ratios"], key=lambda r: (r["mode"], r["run"])):
        lines.append(f"| {row['run']} | {pair(row, 'limit')} | {pair(row, 'pyav')} | {pair(row, 'lerobot')} | "
                     f"{pair(row, 'lerobot_streaming')} |")
    if s.get("pool_memory"):
        lines += ["", "Pool memory (single, uint8 batches of 64): peak RSS against episode_pool_size", "",
                  "| pool size | peak RSS MB | after open MB | batch buffers MB | decoders open / cap | "
                  "frames/CPU-s |", "|---|---|---|---|---|---|"]
        for p in s["pool_memory"]:
            lines.append(f"| {p['pool_size']} | {fmt(p['peak_rss_mb'], 0)} | {fmt(p['rss_after_open_mb'], 0)} | "
                         f"{fmt(p['batch_buffers_mb'], 0)} | {p['decoders_open']} / {p['decoder_cache_capacity']} | "
                         f"{fmt(p['frames_per_cpu_s'])} |")
    lines += ["", "Targets (this machine, each a ratio measured in one run; wall / per CPU-second):", ""]
    lines += targets(s)
    if s["skipped"]:
        lines += ["", "Not run:"] + [f"- {k}: {v}" for k, v in s["skipped"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
