"""Test support shared by every test folder: real servers started on loopback."""
