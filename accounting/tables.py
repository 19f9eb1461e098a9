"""Plain-text tables for the reports, the census and the benchmarks: one formatter for all."""

import textwrap


def table(headers, rows, align=None, indent="  "):
    """Aligned columns. align: one letter per column, l (flush left) or r (flush right);
    default the first column left and the others (numbers) right."""
    align = align or "l" + "r" * (len(headers) - 1)
    cells = [list(headers)] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        indent
        + "  ".join(
            c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(row, widths, align)
        ).rstrip()
        for row in cells
    )


def wrap(text, indent="  "):
    return textwrap.fill(text, width=100, initial_indent=indent, subsequent_indent=indent + "  ")
