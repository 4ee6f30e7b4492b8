"""What hosts a worker in a process: ``processor run`` (a worker with its
health and metrics endpoints), ``processor init``/``cancel``, and the option
table of flags and environment variables. (``processor serve``, which
streams turns to UIs, is ``processor.serve``.)"""
