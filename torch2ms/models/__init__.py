"""PyTorch model definitions shipped with torch2ms (used by recipes)."""
