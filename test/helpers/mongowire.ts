/**
 * MongoDB wire messages for tests of the agent's MongoDB gate: a small BSON encoder (strings, numbers, booleans,
 * binaries, documents) and OP_MSG / OP_QUERY framing, as mongosh and the drivers send them.
 */
export type BsonValue = string | number | boolean | Buffer | { [key: string]: BsonValue };

export function bson(doc: Record<string, BsonValue>): Buffer {
  const parts: Buffer[] = [];
  for (const [name, value] of Object.entries(doc)) {
    const key = Buffer.from(`${name}\0`);
    if (typeof value === 'string') {
      const text = Buffer.from(`${value}\0`);
      const len = Buffer.alloc(4);
      len.writeInt32LE(text.length);
      parts.push(Buffer.from([0x02]), key, len, text);
    } else if (typeof value === 'number') {
      const v = Buffer.alloc(4);
      v.writeInt32LE(value);
      parts.push(Buffer.from([0x10]), key, v);
    } else if (typeof value === 'boolean') {
      parts.push(Buffer.from([0x08]), key, Buffer.from([value ? 1 : 0]));
    } else if (Buffer.isBuffer(value)) {
      const len = Buffer.alloc(4);
      len.writeInt32LE(value.length);
      parts.push(Buffer.from([0x05]), key, len, Buffer.from([0]), value);
    } else {
      parts.push(Buffer.from([0x03]), key, bson(value));
    }
  }
  const body = Buffer.concat(parts);
  const len = Buffer.alloc(4);
  len.writeInt32LE(body.length + 5);
  return Buffer.concat([len, body, Buffer.alloc(1)]);
}

/** An OP_MSG with the body as section 0 and, optionally, a kind-1 section of documents after it. */
export function opMsg(requestId: number, body: Record<string, BsonValue>, sequence?: { id: string; docs: Array<Record<string, BsonValue>> }): Buffer {
  const parts = [Buffer.alloc(4), Buffer.from([0]), bson(body)];
  if (sequence) {
    const docs = Buffer.concat([Buffer.from(`${sequence.id}\0`), ...sequence.docs.map(bson)]);
    const size = Buffer.alloc(4);
    size.writeInt32LE(docs.length + 4);
    parts.push(Buffer.from([1]), size, docs);
  }
  return frame(requestId, 2013, Buffer.concat(parts));
}

export function opQuery(requestId: number, collection: string, query: Record<string, BsonValue>): Buffer {
  const skipReturn = Buffer.alloc(8);
  skipReturn.writeInt32LE(-1, 4);
  return frame(requestId, 2004, Buffer.concat([Buffer.alloc(4), Buffer.from(`${collection}\0`), skipReturn, bson(query)]));
}

export function frame(requestId: number, opCode: number, rest: Buffer): Buffer {
  const h = Buffer.alloc(16);
  h.writeInt32LE(16 + rest.length, 0);
  h.writeInt32LE(requestId, 4);
  h.writeInt32LE(opCode, 12);
  return Buffer.concat([h, rest]);
}

/** A SCRAM client-first message for user. */
export const scramFirst = (user: string) => Buffer.from(`n,,n=${user.replace(/=/g, '=3D').replace(/,/g, '=2C')},r=fyko+d2lbbFgONRv9qkxdawL`);
