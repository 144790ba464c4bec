"""Cases in processes of their own: the parent (Runner), the worker and the children it
forks (a child takes case after case; every red verdict is a fresh child's), the wire
protocol between them, and the crash record. This is where a case dies."""
