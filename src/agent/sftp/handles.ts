/**
 * The open handles of one SFTP session: what a client names with the opaque handle strings it was given.
 * Handles are 4 bytes (a counter); at most `max` are open at once. Pure bookkeeping: closing the file or
 * directory behind a handle is the caller's.
 */
export class HandleTable<T> {
  private readonly open = new Map<number, T>();
  private next = 0;

  constructor(private readonly max: number) {}

  get size(): number {
    return this.open.size;
  }

  /** A new handle for value, or undefined when `max` handles are open already. */
  add(value: T): Buffer | undefined {
    if (this.open.size >= this.max) return undefined;
    while (this.open.has(this.next)) this.next = (this.next + 1) >>> 0;
    const id = this.next;
    this.next = (this.next + 1) >>> 0;
    this.open.set(id, value);
    const handle = Buffer.alloc(4);
    handle.writeUInt32BE(id);
    return handle;
  }

  get(handle: Buffer): T | undefined {
    const id = HandleTable.id(handle);
    return id === undefined ? undefined : this.open.get(id);
  }

  /** Forgets a handle; returns what it named. */
  take(handle: Buffer): T | undefined {
    const id = HandleTable.id(handle);
    if (id === undefined) return undefined;
    const value = this.open.get(id);
    this.open.delete(id);
    return value;
  }

  /** Forgets every handle; returns what they named. */
  takeAll(): T[] {
    const all = [...this.open.values()];
    this.open.clear();
    return all;
  }

  private static id(handle: Buffer): number | undefined {
    return Buffer.isBuffer(handle) && handle.length === 4 ? handle.readUInt32BE() : undefined;
  }
}
