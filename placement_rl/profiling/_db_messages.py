"""The lines a ``ProfileDB`` (``placement_rl.profiling.db``) gives for messages, where it holds no times for a graph:
entries of another precision or another capture, the nodes an entry lacks, times for nodes a graph lacks, and why a
lookup on a topology's devices finds nothing. ``ProfileMessages`` is the database's part that words them."""

from __future__ import annotations

import socket

from placement_rl.graph.ir import CompGraph
from placement_rl.graph.members import member_graph
from placement_rl.profiling._db_records import precision
from placement_rl.topology import DeviceTopology


class ProfileMessages:
    """``ProfileDB``'s message lines (its ``data``, entries, members and device resolution)."""

    def other_precision(self, graph: CompGraph) -> str | None:
        """For messages: where only entries of another precision hold every node of ``graph`` (or of the graph it
        was coarsened from), one line naming both precisions, else None."""
        own = precision(graph.meta)
        wanted = [set(graph.names)]
        if graph.members is not None:
            wanted.append({m for grp in graph.members for m in grp})
        found = [(fp, e) for fp, e in self.data["graphs"].items() if any(w <= set(e["nodes"]) for w in wanted)]
        if not found or any(e.get("precision", "fp32") == own for _, e in found):
            return None
        fp, entry = found[0]
        return (f"the profile's times for graph '{entry.get('name', graph.name)}' (fingerprint {fp}) were measured in "
                f"{entry.get('precision', 'fp32')}, graph '{graph.name}' (fingerprint {graph.fingerprint()}) is {own}: "
                f"a profile prices only the precision it measured; profile the {own} model")

    def other_capture(self, graph: CompGraph) -> str | None:
        """For messages: where ``graph``'s nodes have times only in an entry of another precision
        (``other_precision``), or a coarsened ``graph``'s members only in an entry of another capture (same node
        names; another batch size or shapes), what differs, else None."""
        other = self.other_precision(graph)
        if other is not None:
            return other
        fine = member_graph(graph)
        if fine is None or self._member_candidates(graph):
            return None
        wanted = {m for grp in graph.members or () for m in grp}
        found = next(((fp, e) for fp, e in self.data["graphs"].items() if wanted <= set(e["nodes"])), None)
        if found is None:
            return None
        fp, entry = found
        theirs, ours = entry.get("batch_size"), fine[0].meta.get("batch_size")
        if theirs is not None and ours is not None and theirs != ours:
            return (f"the profile was taken at batch {theirs}, graph '{graph.name}' is at batch {ours}: re-profile "
                    f"at batch {ours}, or use the graph at batch {theirs}")
        return (f"the profile's times for graph '{entry.get('name', graph.name)}' were taken on another capture "
                f"(fingerprint {fp}{f', batch {theirs}' if theirs is not None else ''}) than the graph "
                f"'{graph.name}' was made from (fingerprint {fine[0].fingerprint()}"
                f"{f', batch {ours}' if ours is not None else ''}): the same node names with other sizes (batch, "
                "shapes); re-profile this graph")

    def missing_nodes(self, graph: CompGraph, device_name: str) -> list[str] | None:
        """For messages: the nodes of ``graph`` (for a coarsened graph, its members) the entry recorded for it
        has no times for on ``device_name`` (empty: none missing), or None when no entry holds the graph."""
        entry = self.graph_entry(graph)
        wanted = list(graph.names) if entry is not None else None
        if entry is None and graph.members is not None:
            wanted = [m for grp in graph.members for m in grp]
            entry = self.member_entry(graph)
        if entry is None or wanted is None:
            return None
        times = entry["times"].get(device_name, {})
        return [n for n in wanted if n not in times]

    def foreign_nodes(self, graph: CompGraph) -> tuple[str, str] | None:
        """For a profile read as ``graph``'s costs: a ``(device, node)`` whose times the entry holding ``graph``
        (under its fingerprint, else its members') has for a node neither that entry nor ``graph`` has, or None."""
        entry = self.graph_entry(graph) or self.member_entry(graph)
        if entry is None:
            return None
        known = set(entry["nodes"]) | set(graph.names) | {m for grp in graph.members or () for m in grp}
        return next(((dev, n) for dev, t in sorted(entry["times"].items()) for n in t if n not in known), None)

    def why_no_times(self, graph: CompGraph, topology: DeviceTopology, *, show: int = 3) -> str:
        """For messages: why ``lookup`` finds no times for ``graph`` on ``topology``'s devices -- its members
        profiled in another capture (``other_capture``), the nodes it lacks (the first ``show`` named) on the
        profiled device they resolve to, else the graphs and devices the profile holds."""
        other = self.other_capture(graph)
        if other is not None:
            return other
        for dev in topology.devices:
            name = self.resolve_device(dev)
            missing = self.missing_nodes(graph, name) if name is not None else None
            if missing:
                more = f", ... ({len(missing)} in all)" if len(missing) > show else ""
                return (f"the profile lacks times for {len(missing)} node{'s' if len(missing) != 1 else ''} of "
                        f"graph '{graph.name}' on device '{name}' ({', '.join(missing[:show])}{more})")
        here = socket.gethostname()
        elsewhere = {n: r.get("host") for n, r in self.data["devices"].items() if r.get("host") != here}
        if elsewhere and not any(self.resolve_device(d) for d in topology.devices):
            names = sorted(elsewhere)
            return (f"its device{'s' if len(names) != 1 else ''} "
                    f"{', '.join(f'{n} (host {elsewhere[n]})' for n in names)} {'were' if len(names) != 1 else 'was'}"
                    f" profiled on another host than this one ({here}) and price{'' if len(names) != 1 else 's'} only"
                    f" a topology device named {' or '.join(names)} (topology '{topology.name}' has "
                    f"{', '.join(topology.device_names)})")
        graphs = sorted({str(e.get("name", "?")) for e in self.data["graphs"].values()})
        return (f"the profile has no times for graph '{graph.name}' (fingerprint {graph.fingerprint()}) on any "
                f"device of topology '{topology.name}' (it holds graph{'s' if len(graphs) != 1 else ''} "
                f"{', '.join(graphs) or 'none'} on {', '.join(self.device_names) or 'no device'})")
