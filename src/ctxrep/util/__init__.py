"""Small helpers every floor uses: file reading and writing, progress."""
