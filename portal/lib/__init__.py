"""Small single-purpose helpers shared by the portal's apps (no Django models here)."""
