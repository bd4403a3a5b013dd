"""User-facing errors.

Every error a user can cause (a bad profile, a missing file, a malformed csv row, a missing weight)
is raised as a subclass of :class:`CrsreproError`. The CLI prints such errors as one line, without
a traceback; anything else is a bug and keeps its traceback.
"""


class CrsreproError(Exception):
    """Base class of the errors that a user can cause and fix."""


class ProfileError(CrsreproError, ValueError):
    """A profile is missing, or one of its keys is unknown or has a bad value."""


class DataError(CrsreproError, ValueError):
    """A dataset on disk does not match its release layout (names the file and the row)."""


class MissingWeightsError(CrsreproError, FileNotFoundError):
    """An encoder's weights are not where we looked (names the places and the expected file)."""


class WrongWeightsError(CrsreproError, ValueError):
    """An encoder's weights are there but are not the released ones: the checkpoint cannot be read
    safely, its MD5 or SHA-256 differs from the release's, or it does not fit the architecture (names
    the file and what differs)."""


class UnknownEncoderError(CrsreproError, KeyError):
    """An encoder id is not in the registry."""

    def __str__(self):  # KeyError would quote the message
        return str(self.args[0])
