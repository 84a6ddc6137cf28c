"""Live captions: audio captured as it is spoken (capture), decoded into committed and tentative text
(streaming), with every commit kept on disk as it is made (journal)."""
