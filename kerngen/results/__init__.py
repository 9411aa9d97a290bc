"""What a search leaves, shown: the tree (show), the live view, the HTML report and its charts,
the suite table, the bench table, exports and the exported-op runtime (``kerngen.load``)."""
