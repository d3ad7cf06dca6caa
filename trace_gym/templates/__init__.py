"""Files the scaffolds copy (``trace-gym targets new``): real modules, linted and tested as such."""
