"""Profile: from a MODEL spec to a ranked table of sites and their site problems.

Loading the model, capturing and cutting it into sites (through `core.runtime`), each site's
roofline floor, its in-situ time inside real forwards, and the site table.
"""
