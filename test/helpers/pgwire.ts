/** A PostgreSQL StartupMessage (protocol 3.0) with the given parameters, as a client's first bytes: for tests of what reads it. */
export function pgStartup(params: Array<[string, string]>): Buffer {
  const body = Buffer.concat([...params.map(([k, v]) => Buffer.from(`${k}\0${v}\0`)), Buffer.alloc(1)]);
  const head = Buffer.alloc(8);
  head.writeUInt32BE(body.length + 8, 0);
  head.writeUInt32BE(0x00030000, 4);
  return Buffer.concat([head, body]);
}
