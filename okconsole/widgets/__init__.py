"""Small widgets and widget helpers shared by the screens."""
