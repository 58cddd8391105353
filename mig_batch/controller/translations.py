"""A request's MIG profiles and moldable options per GPU model of the inventory, translated once: the same
request text recurs across jobs and passes."""

from __future__ import annotations

from mig_batch.batch.tags import JobTag, moldable_times, profiles_by_model


class Translations:
    def __init__(self, models: set[str]):
        self.models = models
        self._profiles: dict[str, dict[str, str] | str] = {}  # tag text -> model -> profile, or the error
        self._moldable: dict[str, dict[str, dict[str, float]] | str] = {}  # tag text -> model -> options

    def profiles(self, tag: JobTag) -> dict[str, str] | str:
        """Model -> the smallest profile that fits the request, or why it fits none."""
        key = tag.text()
        if key not in self._profiles:
            self._profiles[key] = profiles_by_model(tag, self.models)
        return self._profiles[key]

    def moldable(self, tag: JobTag) -> dict[str, dict[str, float]] | str:
        """Model -> profile -> predicted seconds of a moldable request, or why it has none."""
        key = tag.text()
        if key not in self._moldable:
            self._moldable[key] = moldable_times(tag, self.models)
        return self._moldable[key]
