"""The rows of a stored weight that are parameters (the rest zero padding), shared by
nn.Parameter and quant.QuantizedWeight."""

import numpy as np


class PaddedRows:
    """What a stored weight with rows (how many leading rows are parameters, the rest zero
    padding: the tied token embedding's aligned vocabulary; None when all are) shows of itself:
    nn.Parameter's and quant.QuantizedWeight's. Needs .shape and .rows."""

    @property
    def unpadded_shape(self):
        return self.shape if self.rows is None else (self.rows,) + tuple(self.shape[1:])

    def unpadded_numel(self):
        return int(np.prod(self.unpadded_shape))

    def unpadded(self, array):
        """The parameter rows of an array of this weight's shape (a view)."""
        return array if self.rows is None else array[: self.rows]
