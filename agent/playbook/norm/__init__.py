"""The playbook's norm: batch/group/instance norm statistics and their application."""
