"""A bar chart with its y scale (the history screen's charts): bars drawn on a zero baseline, the
peak labelled at the top and 0 at the bottom, so a bar's height reads as a rate."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ..charts import bar_rows, scale_label

GUTTER = 8  # the scale's labels ("123456", "99.99", "0") and " ┤"


class BarChart(Widget):
    """Per-minute rates, oldest on the left; `style` colours the bars."""

    DEFAULT_CSS = "BarChart { height: 1fr; }"
    data: reactive[list[float]] = reactive(list, always_update=True)

    def __init__(self, style: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.bar_style = style

    def render(self) -> Text:
        width, height = self.size.width - GUTTER, self.size.height
        if width <= 0 or height <= 0:
            return Text("")
        top = max(self.data, default=0.0)
        rows = bar_rows(self.data, width, height, top)
        text = Text(no_wrap=True, end="")
        for n, row in enumerate(rows):
            label = scale_label(top) if n == 0 else ("0" if n == height - 1 else "")
            if n:
                text.append("\n")
            text.append(f"{label:>{GUTTER - 2}} ┤", style="dim")
            text.append(row, style=self.bar_style)
        return text
