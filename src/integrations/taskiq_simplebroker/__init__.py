"""Taskiq broker and result backend on simplebroker-redis."""
