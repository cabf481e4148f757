"""Placement of the engine threads: which CPUs a rank's loader runs on.

``vlafeed.Loader(..., affinity=...)`` takes

- ``"none"`` (default): the engine threads are not pinned;
- ``"auto"``: the CPUs of the NUMA node local to this rank's GPU, shared
  among the local ranks whose GPUs sit on that node;
- an explicit CPU list (``[0, 1, 2]`` or a Linux cpulist string ``"0-3,8"``),
  checked against the CPUs this process may run on.

``resolve()`` turns the setting into ``{"cpus": [...] or None, "reason":
"..."}`` (what ``Loader.stats()["affinity"]`` reports). "auto" never fails:
without a GPU, or where the GPU's NUMA node cannot be found, it pins nothing
and says why.

How "auto" finds the node: the GPU's PCI bus id (``torch.cuda.
get_device_properties(i).pci_bus_id`` where torch has it, else ``nvidia-smi
--query-gpu=pci.bus_id``), then ``/sys/bus/pci/devices/<id>/numa_node`` and
``/sys/devices/system/node/node<N>/cpulist``, intersected with
``os.sched_getaffinity(0)``. The rank's GPU is ``LOCAL_RANK`` (modulo the
visible GPUs), or torch's current device without ``LOCAL_RANK``. The node's
CPUs are split into contiguous, near-equal shares among the local ranks
(``LOCAL_WORLD_SIZE``) whose GPUs are on the same node, in local-rank order;
when the other ranks' GPUs cannot be told apart, among all local ranks.

Every function that reads the system takes the sysfs root, the environment
and the GPU lookup as arguments, so the tests run them on fake trees.
"""
import os
import subprocess

__all__ = ["parse_cpulist", "format_cpulist", "normalize_pci_bus_id", "pci_numa_node", "node_cpus",
           "split_share", "check_cpus", "decode_threads_for", "resolve", "gpu_pci_bus_ids"]

NO_CUDA = "no CUDA device (torch.cuda.is_available() is False)"


def parse_cpulist(text):
    """CPU ids of a Linux cpulist ("0-3,8,10-11", "" = none), sorted, unique."""
    cpus = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"cpulist: {part!r} is not a CPU id or range") from None
        if first < 0 or last < first:
            raise ValueError(f"cpulist: bad range {part!r}")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def format_cpulist(cpus):
    """The cpulist text of CPU ids ([0, 1, 2, 5] -> "0-2,5")."""
    out, cpus = [], sorted(set(cpus))
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


def normalize_pci_bus_id(bus_id):
    """The sysfs name of a PCI address: nvidia-smi's "00000000:3B:00.0" and torch's
    "0000:3b:00.0" both become "0000:3b:00.0" (4-digit domain, lower case)."""
    text = bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep or rest.count(":") != 1:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    return f"{int(domain, 16):04x}:{rest}"


def pci_numa_node(bus_id, sysfs="/sys"):
    """The NUMA node of a PCI device, or None when unknown (no such device, or -1:
    a single-node machine or a firmware that does not say)."""
    path = os.path.join(sysfs, "bus", "pci", "devices", normalize_pci_bus_id(bus_id), "numa_node")
    try:
        with open(path) as f:
            node = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def node_cpus(node, sysfs="/sys"):
    """The CPUs of NUMA node `node` (its cpulist), or None when the node is unknown."""
    try:
        with open(os.path.join(sysfs, "devices", "system", "node", f"node{node}", "cpulist")) as f:
            return parse_cpulist(f.read())
    except OSError:
        return None


def split_share(cpus, index, count):
    """Share `index` of `count` of the CPU list: contiguous runs whose sizes differ by at
    most one (the first shares one larger). With fewer CPUs than shares, share i gets
    CPU i % len(cpus) (ranks then share a CPU rather than get none)."""
    cpus = sorted(cpus)
    if count <= 1 or not cpus:
        return cpus
    if len(cpus) < count:
        return [cpus[index % len(cpus)]]
    base, extra = divmod(len(cpus), count)
    start = index * base + min(index, extra)
    return cpus[start:start + base + (1 if index < extra else 0)]


def check_cpus(cpus, allowed=None):
    """A user's CPU list (ints or a cpulist string) as sorted unique ints; ValueError
    naming the CPUs that do not exist or are not allowed for this process."""
    if isinstance(cpus, str):
        wanted = parse_cpulist(cpus)
    else:
        try:
            wanted = sorted({int(c) for c in cpus})
        except (TypeError, ValueError):
            raise ValueError(f"affinity: a CPU list must hold CPU ids, not {cpus!r}") from None
    if not wanted:
        raise ValueError("affinity: the CPU list is empty")
    allowed = set(os.sched_getaffinity(0) if allowed is None else allowed)
    bad = [c for c in wanted if c not in allowed]
    if bad:
        raise ValueError(f"affinity: CPU(s) {format_cpulist(bad)} do not exist or are not allowed for this "
                         f"process (allowed: {format_cpulist(allowed)})")
    return wanted


def decode_threads_for(cores, engine_threads):
    """decode_threads=0 (auto): the rank's cores shared by its engine threads, at least 1,
    at most 8 (the engine's rule, include/vlafeed/loader.h "Placement")."""
    return max(1, min(8, cores // max(1, engine_threads)))


def local_rank_world(env=None):
    """(LOCAL_RANK, LOCAL_WORLD_SIZE) from the environment; (None, 1) without LOCAL_RANK."""
    env = os.environ if env is None else env
    try:
        rank = int(env["LOCAL_RANK"]) if env.get("LOCAL_RANK", "") != "" else None
        world = int(env.get("LOCAL_WORLD_SIZE") or 1)
    except ValueError:
        return None, 1
    return rank, max(world, (rank or 0) + 1)


def gpu_pci_bus_ids(torch=None, run=subprocess.run):
    """The PCI bus ids of the visible GPUs in torch's device order, or (None, reason)."""
    if torch is None:
        try:
            import torch
        except ImportError:
            return None, "torch is not installed"
    if not torch.cuda.is_available():
        return None, NO_CUDA
    count = torch.cuda.device_count()
    ids = []
    for i in range(count):
        props = torch.cuda.get_device_properties(i)
        bus = getattr(props, "pci_bus_id", None)
        if isinstance(bus, str) and bus:
            ids.append(bus)
        elif isinstance(bus, int) and hasattr(props, "pci_domain_id") and hasattr(props, "pci_device_id"):
            ids.append(f"{props.pci_domain_id:04x}:{bus:02x}:{props.pci_device_id:02x}.0")
        else:
            break
    if len(ids) == count:
        return ids, "torch"
    try:  # nvidia-smi lists every GPU; map torch's order through CUDA_VISIBLE_DEVICES when set
        out = run(["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"], capture_output=True,
                  text=True, timeout=20)
        listed = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"cannot find the GPUs' PCI bus ids (torch has no pci_bus_id; nvidia-smi: {e})"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if visible and all(v.strip().isdigit() for v in visible.split(",")):
        order = [int(v) for v in visible.split(",")]
        listed = [listed[i] for i in order if i < len(listed)]
    if len(listed) < count:
        return None, f"nvidia-smi listed {len(listed)} PCI bus ids for {count} visible GPUs"
    return listed[:count], "nvidia-smi"


def _auto(sysfs, allowed, env, bus_ids):
    ids, how = bus_ids() if callable(bus_ids) else bus_ids
    if ids is None:
        return None, f"auto: not pinned: {how}"
    local_rank, local_world = local_rank_world(env)
    if local_rank is None:
        gpu = _current_device(len(ids))
    else:
        gpu = local_rank % len(ids)
    nodes = [pci_numa_node(b, sysfs) for b in ids]
    node = nodes[gpu]
    if node is None:
        return None, f"auto: not pinned: the NUMA node of GPU {gpu} ({ids[gpu]}) is unknown"
    cpus = node_cpus(node, sysfs)
    if not cpus:
        return None, f"auto: not pinned: NUMA node {node} lists no CPUs"
    usable = sorted(set(cpus) & set(allowed))
    if not usable:
        return None, f"auto: not pinned: none of NUMA node {node}'s CPUs is allowed for this process"
    rank = local_rank or 0
    if local_world > 1 and len(ids) >= local_world:
        peers = [r for r in range(local_world) if nodes[r % len(ids)] == node]
    else:
        peers = list(range(local_world))
    share = split_share(usable, peers.index(rank) if rank in peers else rank, len(peers))
    return share, (f"auto: GPU {gpu} ({normalize_pci_bus_id(ids[gpu])}, bus id from {how}) is on NUMA node {node}; "
                   f"local rank {rank}: share {peers.index(rank) + 1 if rank in peers else rank + 1} of "
                   f"{len(peers)} of its allowed CPUs {format_cpulist(usable)}")


def _current_device(count):
    try:
        import torch
        return torch.cuda.current_device() % count
    except Exception:  # noqa: BLE001 - any failure means "the first GPU"
        return 0


def resolve(affinity, sysfs="/sys", allowed=None, env=None, bus_ids=None):
    """{"cpus": sorted CPU ids or None, "reason": text} for an affinity setting ("none",
    "auto", a list of CPU ids or a cpulist string). Explicit lists raise ValueError when a
    CPU does not exist or is not allowed; "auto" never raises. bus_ids: a callable
    returning (ids, how) or (None, reason), default gpu_pci_bus_ids."""
    if affinity is None or affinity == "none":
        return {"cpus": None, "reason": "affinity='none': not pinned"}
    allowed = set(os.sched_getaffinity(0) if allowed is None else allowed)
    if affinity == "auto":
        cpus, reason = _auto(sysfs, allowed, env, gpu_pci_bus_ids if bus_ids is None else bus_ids)
        return {"cpus": cpus, "reason": reason}
    if isinstance(affinity, str) and not any(ch.isdigit() for ch in affinity):
        raise ValueError(f"affinity must be 'auto', 'none' or a CPU list, not {affinity!r}")
    cpus = check_cpus(affinity, allowed)
    return {"cpus": cpus, "reason": f"explicit: CPUs {format_cpulist(cpus)}"}
