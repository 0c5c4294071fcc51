# The path of a key: escape it as one path segment, so that "/" and "%" in
# a key stay part of it. Usage: python3 escape_key.py KEY...
import sys
import urllib.parse

for key in sys.argv[1:]:
    print("/v1/keys/" + urllib.parse.quote(key, safe=""))
