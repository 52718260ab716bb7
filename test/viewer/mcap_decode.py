"""Read an exported MCAP back with the mcap library, decoding each message with the schema written in it."""

import json
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from mcap.reader import make_reader


def _protobuf_class(schema):
    # The SDK embeds a FileDescriptorSet per protobuf schema: a pool per schema keeps them apart.
    files = descriptor_pb2.FileDescriptorSet.FromString(schema.data)
    pool = descriptor_pool.DescriptorPool()
    for proto in files.file:
        pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(schema.name))


def read_mcap(path: Path) -> dict:
    """Messages per topic as (log_time, decoded, schema encoding), plus metadata and attachments."""
    topics: dict[str, list] = {}
    classes: dict[int, object] = {}
    with open(path, 'rb') as handle:
        reader = make_reader(handle)
        for schema, channel, message in reader.iter_messages(log_time_order=True):
            if schema.encoding == 'protobuf':
                if schema.id not in classes:
                    classes[schema.id] = _protobuf_class(schema)
                decoded = classes[schema.id].FromString(message.data)
            elif schema.encoding == 'jsonschema':
                assert channel.message_encoding == 'json'
                decoded = json.loads(message.data)
            else:  # ros2msg: merged bag topics, kept as CDR bytes
                assert schema.encoding == 'ros2msg' and channel.message_encoding == 'cdr'
                decoded = message.data
            topics.setdefault(channel.topic, []).append((message.log_time, decoded, schema))
        handle.seek(0)
        reader = make_reader(handle)
        metadata = {m.name: dict(m.metadata) for m in reader.iter_metadata()}
        attachments = {a.name: a.data for a in reader.iter_attachments()}
    return {'topics': topics, 'metadata': metadata, 'attachments': attachments}
