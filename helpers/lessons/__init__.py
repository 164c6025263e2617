"""One module per lesson notebook, its number in its name: sizes, figures, widgets, exercise checkers."""
