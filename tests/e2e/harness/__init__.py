"""Test harness of the operator tests: the operator as a subprocess, and a kubelet stand-in for kwok's fake nodes."""
