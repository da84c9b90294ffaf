"""Strategy `sharded_update`: `replicated`'s in-graph towers with the weight update sharded across the devices.

`replicated` has every device apply the same averaged gradient to its own full copy: N times the update work and
the optimizer state. Sharding the update (Xu et al. 2020, "Automatic Cross-Replica Sharding of Weight Update in
Data-Parallel Training"; ZeRO stage 1) removes both: per step,

1. each tower cuts its gradients into N slices of the flattened parameters (padded to a multiple of N, across
   variable boundaries);
2. reduce-scatter: device j averages the towers' slice j;
3. device j applies its own optimizer to its slice of the weights, a variable of P/N values living on it;
4. all-gather: every device writes the N updated slices into its model copy.

Slices of the flattened parameters, not of every variable: one update per device per step whatever the model has.
The slices are read from and written to the variables they cover (`pieces`), never built as one flat vector (the
copies would cost more than the sharding saves). Embedding tables (`common.tables`) are not flattened, which would
make each tower's gradient a dense table: device j owns rows j*R to (j+1)*R of every table and their optimizer
state; each tower sends each owner its looked-up rows, and the owners write back only the rows they updated. A
device's rows of the tables of one width are one variable (`groups`): one sparse update and one read of the rows
it changed a device and group, not one a table (DLRM's 26 tables at 4 devices: 8,689 ops a step before, 4,701
after; each op is traced, optimised and run).

The averaged gradient and the update are `replicated`'s, so the two train the same losses (not bit-identical: a
slice of a gradient may round differently). Checkpoint names carry N: they restore onto the same device count only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from runner.lazy import keras, tf
from runner.strategies import NO_ROWS, STRATEGIES, Exchange, Rows, Traffic, Training, ring
from runner.strategies.common import placed_copies, tables
from runner.strategies.replicated import Replicated, Towers, TowersOptions, mean_of

if TYPE_CHECKING:
    from runner.runtime.devices import Devices


@STRATEGIES.register
@dataclass
class ShardedUpdate(TowersOptions):
    """replicated's towers; each device updates 1/N of the weights and holds 1/N of the optimizer state."""

    name: str = "sharded_update"
    # variables spread over the devices, each updating its own: tf_cnn_benchmarks' parameter server on the GPUs
    tf_cnn: ClassVar[dict[str, tuple[str, ...]]] = {
        "--variable_update=parameter_server --local_parameter_device=gpu": ()}
    unsharded: ClassVar[type] = Replicated  # the same towers and reduction, every device updating every weight

    def table_copies(self, devices: int) -> tuple[float, float]:
        return max(devices, 1), 1  # a copy per tower to look rows up in; each row's optimizer state once

    def build(self, devices: Devices, training: Training) -> ShardedTowers:
        return ShardedTowers(list(devices.names), training)

    def exchange(self, devices: int, nodes: int, weight_bytes: float) -> Exchange:
        """Slices to their owners and the updated slices back (a ring's bytes); each device sums its slice of the N
        towers and updates 1 / N of the weights."""
        return Exchange(link_bytes=ring(devices, weight_bytes), device_sums=1.0, device_update=1 / devices)

    def traffic(self, devices: int, weight_bytes: int, variables: int, rows: Rows = NO_ROWS) -> Traffic:
        """Each tower cuts its gradients into N slices (copies: read and write W each); device j sums and divides
        its slice of the N towers ((N + 3) W over the devices); N updates of 1/N; every device assembles the N
        updated slices and writes them into its copy (copies: 4 W each). Slices travel to their owner and back:
        2 (N - 1) W.

        The tables' rows (`_by_owner`, `_changed_rows`, `_gather_rows`; tables of one width): each tower partitions
        its rows by owner (copy 2 R) and sends (N - 1) / N of them away (values and rows: 2 N (N - 1) messages);
        each owner concatenates and divides the N R / N it receives (2 N R over the owners) and applies them, the N
        owners at once; the rows they changed are put together on one device ((N - 1) R in, copy 2 N R), sent to
        the other copies ((N - 1) N R; 3 tensors each way: 6 (N - 1) messages) and each copy partitions them by
        table and scatters them (2 N R per copy). Ops: 5 per tower and table and 5 per tower; 5 per owner (concat,
        divide, apply) and 6 for the rows it changed, 3 to put them together; 2 per copy and 1 per copy and table.
        Counted for the tables of one width (one group); each other width repeats the per-group terms."""
        n, w, r, t = devices, weight_bytes, rows.tower_bytes, rows.tables
        dense = Traffic(update_copies=1, update_devices=n, reduce_bytes=(n + 3) * w, reduce_devices=n,
                        moved_bytes=2 * (n - 1) * w, messages=2 * n * (n - 1),
                        ops=n * (variables + n) + 3 * n + 3 * n * variables, copy_bytes=(2 * n + 4 * n) * w)
        if not t:
            return dense
        return dense + Traffic(reduce_bytes=2 * n * r, reduce_devices=n, copy_bytes=(6 * n + 2 * n * n) * r,
                               moved_bytes=2 * (n - 1) * r + (n - 1) * n * r, messages=2 * n * (n - 1) + 6 * (n - 1),
                               ops=n * (6 * t + 18) + 3, rows_applied=n * r, rows_devices=n)


def groups(tables: list[Any], rows: list[int]) -> tuple[list[list[int]], list[int]]:
    """The tables grouped by width and dtype, as positions in `tables` (a device holds its rows of a group's tables as
    one variable), and each table's first row in that variable: its part of each, `rows` R apiece, one after another."""
    kinds: dict[tuple, list[int]] = {}
    for t, table in enumerate(tables):
        kinds.setdefault((tuple(table.shape[1:]), table.dtype), []).append(t)
    base = [0] * len(tables)
    for group in kinds.values():
        for before, t in zip(group, group[1:]):
            base[t] = base[before] + rows[before]
    return list(kinds.values()), base


def pieces(sizes: list[int], n: int) -> tuple[list[list[tuple[int, int, int]]], int]:
    """For each of the flat weights' N slices, the (variable index, start, end) ranges of the flattened variables it
    holds, in order; and the slice length (the last slice is padded with zeros up to it)."""
    length = math.ceil(sum(sizes) / n)
    out: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
    offset = 0
    for index, size in enumerate(sizes):
        start = 0
        while start < size:
            j = (offset + start) // length
            end = min(size, (j + 1) * length - offset)
            out[j].append((index, start, end))
            start = end
        offset += size
    return out, length


class ShardedTowers(Towers):
    """A model copy per device for the towers (no optimizer), and the weights' N slices with their optimizers."""

    def __init__(self, devices: list[str], training: Training):
        self.devices = self.tower_devices = self.homes = devices
        self.training, self.replicated = training, True
        self.models = placed_copies(training.model_fn, training.seed, devices)
        variables = self.models[0].trainable_variables
        table_ids = {id(t) for t in tables(self.models[0])}
        self.table_index = [i for i, v in enumerate(variables) if id(v) in table_ids]  # row-sharded
        self.flat_index = [i for i, v in enumerate(variables) if id(v) not in table_ids]  # flattened and sliced
        flats = [variables[i] for i in self.flat_index]
        n = len(devices)
        self.pieces, self.slice = pieces([math.prod(v.shape) for v in flats], n)
        self.rows = [math.ceil(variables[i].shape[0] / n) for i in self.table_index]  # R: rows each device owns
        self.groups, self.base = groups([variables[i] for i in self.table_index], self.rows)
        self.shards, self.table_shards, self.optimizers = [], [], []
        for j, device in enumerate(devices):
            with tf.device(device):
                shard = keras.Variable(self._slice([v.value for v in flats], j), name=f"shard{j}_of_{n}")
                owned = [keras.Variable(self._owned(variables, group, j), name=f"tables{g}_rows{j}_of_{n}")
                         for g, group in enumerate(self.groups)]  # (sum of the group's R, d) each
                self.shards.append(shard)
                self.table_shards.append(owned)
                # adamw: a 1-D shard is not decayed; the tables' rows it owns are its tables
                self.optimizers.append(training.optimizer_fn([shard, *owned], owned))
        # adamw's decay, applied here to the values of slice j that belong to weights of 2 or more dimensions
        flags = [tf.fill(v.shape, 1.0 if len(v.shape) >= 2 else 0.0) for v in flats]
        self.decayed = [self._slice(flags, j) for j in range(n)]
        self._share(self.models[0], devices[0])

    def _average(self, grads: list[list[Any]]) -> list[list[Any]]:
        """Reduce-scatter: each tower's gradients cut into the N slices where they were made (its tables' rows by
        owner), then device j averages slice j and the table rows it owns: its shard's gradients."""
        n = len(self.devices)
        slices, rows = [], []
        for device, tower in zip(self.devices, grads):
            with tf.device(device):
                flats = [tower[k] for k in self.flat_index]
                slices.append([self._slice(flats, j) for j in range(n)])  # each (P/N,)
                rows.append([self._by_owner(tower, g) for g in range(len(self.groups))])
        averaged = []
        for j, device in enumerate(self.devices):
            with tf.device(device):
                owned = [mean_of([tower[g][j] for tower in rows]) for g in range(len(self.groups))]
                averaged.append([tf.add_n([s[j] for s in slices]) / n, *owned])
        return averaged

    def _apply(self, grads: list[list[Any]]) -> None:
        """Device j applies its averaged slice to its shard, adamw's decay of the shard's 2-D weights first, as Keras'
        AdamW does (its own skips the 1-D shard; a device's table rows are 2-D: its optimizer decays them); then every
        copy gathers the updated slices."""
        for j, (device, grad, optimizer) in enumerate(zip(self.devices, grads, self.optimizers)):
            mine = [self.shards[j], *self.table_shards[j]]
            with tf.device(device):
                if self.training.weight_decay:  # the dense weights' optimizer is adamw
                    rate = tf.cast(optimizer.learning_rate, mine[0].dtype)  # at this step, before it counts the step
                    shard = self.shards[j]
                    shard.assign_sub(shard.value * self.decayed[j] * (rate * self.training.weight_decay))
                optimizer.apply_gradients(zip(grad, mine))
        changed = self._changed_rows([g[1:] for g in grads])
        for device, model in zip(self.devices, self.models):
            with tf.device(device):  # all-gather: each variable of this copy from the slices that hold it
                self._gather(model)
                self._gather_rows(model, changed)

    def _owned(self, variables: list[Any], group: list[int], j: int) -> tf.Tensor:
        """Device j's rows of a group's tables, one after another, R apiece (a part past a table's end padded with
        zeros)."""
        parts = []
        for t in group:
            r = self.rows[t]
            part = variables[self.table_index[t]].value[j * r:(j + 1) * r]
            parts.append(tf.pad(part, [[0, r - part.shape[0]], [0, 0]]))
        return tf.concat(parts, 0)

    def _by_owner(self, grads: list[Any], g: int) -> list[Any]:
        """A tower's gradients of group `g`'s tables (tf.IndexedSlices of the rows it looked up) cut into N parts by
        owner (device j: rows j R to (j + 1) R - 1 of each table), numbered as rows of the owner's variable."""
        n = len(self.devices)
        owners, local, values = [], [], []
        for t in self.groups[g]:
            grad, r = grads[self.table_index[t]], self.rows[t]
            if not isinstance(grad, tf.IndexedSlices):  # a table used beyond lookups: every row
                grad = tf.IndexedSlices(grad, tf.range(tf.shape(grad, out_type=tf.int64)[0]))
            indices = tf.cast(grad.indices, tf.int64)
            owners.append(tf.cast(indices // r, tf.int32))
            local.append(indices % r + self.base[t])
            values.append(grad.values)
        owner, shape = tf.concat(owners, 0), tf.constant(tuple(self.table_shards[0][g].shape), tf.int64)
        values, local = tf.concat(values, 0), tf.concat(local, 0)
        return [tf.IndexedSlices(v, i, shape) for v, i in
                zip(tf.dynamic_partition(values, owner, n), tf.dynamic_partition(local, owner, n))]

    def _changed_rows(self, grads: list[list[Any]]) -> list[list[Any] | None]:
        """Per group, the rows the owners changed (owner j's gradients: `grads[j]`), each read on its owner once for
        every copy, then put together: (each row's table in the group, its row in that table, its values). None where
        the tables' optimizer may have changed every row of its part (not `Training.tables_rows_only`)."""
        out: list[list[Any] | None] = []
        for g, group in enumerate(self.groups):
            if not self.training.tables_rows_only:
                out.append(None)
                continue
            base = tf.constant([self.base[t] for t in group], tf.int64)
            parts = []
            for j, device in enumerate(self.devices):
                with tf.device(device):
                    local = tf.unique(grads[j][g].indices)[0]  # (u,) rows of owner j's variable that changed
                    which = tf.searchsorted(base, local, side="right") - 1  # each row's table in the group
                    to_table = tf.constant([j * self.rows[t] - self.base[t] for t in group], tf.int64)
                    parts.append((which, local + tf.gather(to_table, which),
                                  tf.gather(self.table_shards[j][g].value, local)))
            with tf.device(self.devices[0]):
                out.append([tf.concat(part, 0) for part in zip(*parts)])
        return out

    def _gather_rows(self, model: Any, changed: list[list[Any] | None]) -> None:
        """Write each table's updated rows into a model copy: the rows the owners changed (`_changed_rows`), else
        each owner's whole part."""
        variables = model.trainable_variables
        for g, group in enumerate(self.groups):
            if changed[g] is None:
                for t in group:
                    table, r, base = variables[self.table_index[t]], self.rows[t], self.base[t]
                    for j, owned in enumerate(self.table_shards):
                        size = min(r, table.shape[0] - j * r)
                        if size > 0:
                            table.value[j * r:j * r + size].assign(owned[g].value[base:base + size])
                continue
            which, rows, values = changed[g]
            by_table = zip(group, tf.dynamic_partition(rows, which, len(group)),
                           tf.dynamic_partition(values, which, len(group)))
            for t, indices, updates in by_table:
                tf.raw_ops.ResourceScatterUpdate(resource=variables[self.table_index[t]].value.handle, indices=indices,
                                                 updates=updates)

    def _slice(self, grads: list[tf.Tensor], j: int) -> tf.Tensor:
        """Slice j (P/N,) of the flattened gradients, read from the variables it covers."""
        parts = [tf.reshape(grads[v], [-1])[a:b] for v, a, b in self.pieces[j]]
        short = self.slice - sum(b - a for _, a, b in self.pieces[j])
        parts += [tf.zeros([short], grads[0].dtype)] if short else []
        return parts[0] if len(parts) == 1 else tf.concat(parts, 0)

    def _gather(self, model: Any) -> None:
        """Write the updated slices into a model copy's variables."""
        flats = [model.trainable_variables[i] for i in self.flat_index]
        found: list[list[tf.Tensor]] = [[] for _ in flats]
        for j, shard in enumerate(self.shards):
            offset = 0
            for v, a, b in self.pieces[j]:
                found[v].append(shard.value[offset:offset + b - a])
                offset += b - a
        for variable, parts in zip(flats, found):
            value = parts[0] if len(parts) == 1 else tf.concat(parts, 0)
            variable.assign(tf.reshape(value, variable.shape))

    def _kept(self) -> dict[str, Any]:
        """Every model copy (its non-trainable state too), every shard and its optimizer; names carry N."""
        n = len(self.devices)
        return {**{f"model{i}": m.variables for i, m in enumerate(self.models)},
                **{f"shard{j}_of_{n}": [s, *self.table_shards[j]] for j, s in enumerate(self.shards)},
                **{f"optimizer{j}_of_{n}": o for j, o in enumerate(self.optimizers)}}

    def variable_devices(self) -> dict[str, str]:
        """Every model copy's variables and every shard, with the device they live on."""
        out = super().variable_devices()
        shards = [*self.shards, *(t for owned in self.table_shards for t in owned)]
        return {**out, **{s.path: s.value.device for s in shards}}

    def describe(self) -> dict[str, str]:
        n = len(self.devices)
        return {"placement": f"a model copy per device on {', '.join(self.devices)}; device j updates weights "
                             f"and optimizer state slice j of {n} ({self.slice:,} values each)"}
