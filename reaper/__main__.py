from reaper.cli import entry

entry()
