"""The destination's watch side: facts read from resources, the cluster index, and its publishers.

``cluster`` consumes the platform's resource events into indexes of facts
(``facts``); ``endpoints``, ``profiles``, ``opaque_ports`` and ``workloads``
publish what proxies ask about to listeners (``listeners``), keyed the way
Linkerd's watchers key them: snapshot first, then changes.  Nothing in this
package imports a generated protobuf or does I/O: listeners are the
translators in ``tether.destination``, and their callbacks must never block.
"""
