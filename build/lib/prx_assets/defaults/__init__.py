"""Package data: the demo project's config files (``config/`` of the repository, shipped in the wheel).

``prx-assets demo`` writes them to ``./config`` when no config folder exists, so an installed
package runs the demo from any folder. A test keeps them identical to the repository's ``config/``.
"""
