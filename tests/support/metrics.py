"""Reading a service's `/metrics` (a running one, or an app through Flask's test
client): the samples of one scrape, parsed with prometheus_client's own parser, and
the value of one series in them."""

import requests
from prometheus_client.parser import text_string_to_metric_families


class Scrape:
    """The samples of one scrape of `/metrics`: `value(name, **labels)` is the sum of
    the samples named `name` whose labels include `labels` (None: no such sample)."""

    def __init__(self, text):
        self.text = text
        self.samples = [sample for family in text_string_to_metric_families(text) for sample in family.samples]

    def value(self, name, **labels):
        found = [
            sample.value
            for sample in self.samples
            if sample.name == name and all(sample.labels.get(key) == str(want) for key, want in labels.items())
        ]
        return sum(found) if found else None

    def labels_of(self, name):
        """The label sets of the samples named `name`."""
        return [sample.labels for sample in self.samples if sample.name == name]


def scrape(service):
    """One scrape of the service's `/metrics` (on its loopback port, as Prometheus reads it)."""
    response = requests.get(f"{service.base_url}/metrics", timeout=10)
    response.raise_for_status()
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4"), response.headers["Content-Type"]
    return Scrape(response.text)


def scrape_client(client):
    """One scrape of `/metrics` through a Flask test client (an app in this process)."""
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4"), response.headers["Content-Type"]
    return Scrape(response.get_data(as_text=True))
