"""The live metrics panel: speed, per-token decoder costs with a small plot, KV cache (own arena or shared
pool), latency, backend, and the engine A/B switch whose effect it shows (the decoder's KV cache on the
device or on the host)."""

from __future__ import annotations

from collections import deque

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal, Slot
from PySide6.QtWidgets import QComboBox, QFormLayout, QLabel, QVBoxLayout, QWidget

__all__ = ["KV_MODES", "MetricsPanel", "PLOT_TOKENS"]

KV_MODES = {"device": "on the device (resident)", "host": "on the host (baseline)"}

PLOT_TOKENS = 300  # decoder calls shown in the plot
_COMPUTE_PEN = pg.mkPen("#4ea8de", width=2)
_KV_IO_PEN = pg.mkPen("#f4a259", width=2)

# (row label, how to show the metrics) in display order.
_ROWS = {
    "rtf": ("RTF (rolling / mean)", lambda m: f"{m.rtf:.2f} / {m.rtf_mean:.2f}"),
    "encoder": ("Encoder per step", lambda m: f"{m.encoder_ms:.0f} ms"),
    "decode": ("Decode per token", lambda m: f"{m.decode_ms_per_token:.2f} ms"),
    "split": ("  compute · KV/IO", lambda m: f"{m.compute_ms_per_token:.2f} · {m.kv_io_ms_per_token:.2f} ms"),
    "kv": ("KV cache fill", lambda m: _kv(m)),
    "graphs": ("Decoder graphs", lambda m: f"{m.graph_reuses} reused · {m.graph_builds} built"),
    "latency": ("First partial · commit lag",
                lambda m: f"{_seconds(m.first_partial_s)} · {_seconds(m.commit_lag_s)}"),
    "dropped": ("Dropped audio blocks", lambda m: _dropped(m)),
    "rewrites": ("Tentative words rewritten", lambda m: str(m.rewrites)),
    "backend": ("Backend / device", lambda m: f"{m.backend} / {m.device} · KV on {m.kv_mode}"),
}


def _kv(m) -> str:
    """Cells in use, and the memory behind them: the session's own arena, or its blocks of the shared pool
    and how much of the pool every session holds."""
    cells = f"{m.kv_tokens} / {m.kv_capacity_tokens} tokens"
    if m.kv_paged:
        return f"{cells} · {m.kv_mib:.2f} MiB · pool {m.kv_pool_used_mib:.1f} / {m.kv_capacity_mib:.0f} MiB"
    return f"{cells} · {m.kv_mib:.2f} of {m.kv_capacity_mib:.1f} MiB"


def _dropped(m) -> str:
    """The total, and a mix's inputs one by one (in the input picker's order) once any has lost audio."""
    if len(m.dropped_by_input) < 2 or not m.dropped_blocks:
        return str(m.dropped_blocks)
    return f"{m.dropped_blocks} ({' + '.join(map(str, m.dropped_by_input))} by input)"


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"


class MetricsPanel(QWidget):
    """Shows the latest streaming `Metrics`; the plot spreads each step's per-token means over its tokens."""

    kv_mode_changed = Signal(str)  # a key of KV_MODES, picked by the user

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("metricsPanel")
        form = QFormLayout()
        form.setContentsMargins(0, 0, 0, 0)
        self.kv_combo = QComboBox()
        self.kv_combo.setToolTip("Where the decoder keeps its KV cache; the host round-trip is the measured "
                                 "baseline. Applies from the next Start or file.")
        for mode, label in KV_MODES.items():
            self.kv_combo.addItem(label, mode)
        self.kv_combo.activated.connect(lambda _index: self.kv_mode_changed.emit(self.kv_combo.currentData()))
        form.addRow("Decoder KV cache", self.kv_combo)
        self._values: dict[str, QLabel] = {}
        for key, (label, _) in _ROWS.items():
            value = QLabel("—")
            value.setObjectName(f"metric_{key}")
            self._values[key] = value
            form.addRow(label, value)
        self._fallback = QLabel()
        self._fallback.setObjectName("fallbackWarning")
        self._fallback.setWordWrap(True)
        self._fallback.hide()
        self._compute: deque[float] = deque(maxlen=PLOT_TOKENS)
        self._kv_io: deque[float] = deque(maxlen=PLOT_TOKENS)
        self._plot = pg.PlotWidget()
        self._plot.setObjectName("tokenPlot")
        self._plot.setBackground(None)
        self._plot.setMinimumHeight(140)
        self._plot.setMouseEnabled(x=False, y=False)
        self._plot.hideButtons()
        self._plot.setLabel("left", "ms / token")
        self._plot.setLabel("bottom", f"last {PLOT_TOKENS} tokens")
        self._plot.addLegend(offset=(6, 6))
        self._compute_curve = self._plot.plot(pen=_COMPUTE_PEN, name="compute")
        self._kv_io_curve = self._plot.plot(pen=_KV_IO_PEN, name="KV/IO")
        layout = QVBoxLayout(self)
        layout.addWidget(self._fallback)
        layout.addLayout(form)
        layout.addWidget(self._plot, 1)

    @Slot(str)
    def set_kv_mode(self, mode: str) -> None:
        self.kv_combo.setCurrentIndex(max(0, self.kv_combo.findData(mode)))

    def value_text(self, key: str) -> str:
        return self._values[key].text()

    def fallback_text(self) -> str:
        return self._fallback.text() if self._fallback.isVisibleTo(self) else ""

    def plotted_tokens(self) -> int:
        return len(self._compute)

    @Slot(object)
    def set_metrics(self, metrics) -> None:
        for key, (_, show) in _ROWS.items():
            self._values[key].setText(show(metrics))
        self._set_fallback(metrics.fallback_ops)
        if metrics.tokens_given:
            self._compute.extend([metrics.compute_ms_per_token] * metrics.tokens_given)
            self._kv_io.extend([metrics.kv_io_ms_per_token] * metrics.tokens_given)
            self._compute_curve.setData(np.fromiter(self._compute, float))
            self._kv_io_curve.setData(np.fromiter(self._kv_io, float))

    @Slot()
    def reset(self) -> None:
        for value in self._values.values():
            value.setText("—")
        self._compute.clear()
        self._kv_io.clear()
        self._compute_curve.setData([])
        self._kv_io_curve.setData([])
        self._set_fallback(())

    def _set_fallback(self, ops) -> None:
        self._fallback.setVisible(bool(ops))
        self._fallback.setText(f"⚠ Ran on the CPU instead of the accelerator: {', '.join(ops)}" if ops else "")
