"""flatbuffers.Builder with the calls the writer makes per table, string and offset done in one Python
call each, writing the same bytes.

The library's Builder spends most of a graph's packing in its own small methods: a string is an
alignment step, a placed zero, a copy and an end-of-vector, each a further call to Prep, Pad, Place and
Offset. This subclass overrides those entry points (the ones encode_schema and flatc's generated Pack
call) with the same arithmetic inlined: the same alignment, the same vtable sharing, the same errors
for nesting and offset misuse. tests/format/test_graph_packing.py packs whole programs through both and
compares the bytes.
"""

from __future__ import annotations

import struct

import flatbuffers
import flatbuffers.number_types as N
from flatbuffers.builder import IsNestedError, IsNotNestedError, OffsetArithmeticError

_U32 = struct.Struct("<I").pack_into
_I32 = struct.Struct("<i").pack_into


class Builder(flatbuffers.Builder):
    """A flatbuffers.Builder whose hot methods write the library's bytes in fewer Python calls."""

    def _room(self, size: int, additional: int) -> int:
        """Prep(size, additional): zero padding so that ``size`` is aligned once ``additional`` bytes are
        written, the buffer grown as needed; returns the new head."""
        if size > self.minalign:
            self.minalign = size
        pad = (-(len(self.Bytes) - self.head + additional)) & (size - 1)
        head = self._grown(pad + size + additional)
        if pad:
            self.Bytes[head - pad:head] = bytes(pad)
            head -= pad
        self.head = head
        return head

    def _grown(self, needed: int) -> int:
        """The head once the buffer has at least ``needed`` free bytes before it (grown as the library
        grows it: doubled, the written bytes kept at the end)."""
        while self.head < needed:
            size = len(self.Bytes)
            self.GrowByteBuffer()
            self.head += len(self.Bytes) - size
        return self.head

    def Prep(self, size, additionalBytes):  # noqa: N802,N803 (the library's names)
        self._room(size, additionalBytes)

    def CreateString(self, s, encoding="utf-8", errors=None):  # noqa: N802 (errors: None is str.encode's default)
        if self.nested:
            raise IsNestedError()
        if isinstance(s, str):
            x = s.encode(encoding) if errors is None else s.encode(encoding, errors)
        elif isinstance(s, (bytes, bytearray)):
            x = s
        else:
            raise TypeError("non-string passed to CreateString")
        n = len(x)
        head = self._room(4, n + 1) - 1
        buf = self.Bytes
        buf[head] = 0
        head -= n
        buf[head:head + n] = x
        head -= 4
        _U32(buf, head, n)
        self.head = head
        self.vectorNumElems = None
        return len(buf) - head

    def StartObject(self, numfields):  # noqa: N802
        if self.nested:
            raise IsNestedError()
        self.current_vtable = [0] * numfields
        self.objectEnd = len(self.Bytes) - self.head
        self.nested = True

    def Slot(self, slotnum):  # noqa: N802
        if not self.nested:
            raise IsNotNestedError()
        self.current_vtable[slotnum] = len(self.Bytes) - self.head

    def Prepend(self, flags, off):  # noqa: N802
        width = flags.bytewidth
        head = self._room(width, 0) - width
        try:
            flags.packer_type.pack_into(self.Bytes, head, off)
        except struct.error:
            N.enforce_number(off, flags)  # the library's TypeError for a number out of range
            raise
        self.head = head

    def PrependUOffsetTRelative(self, off):  # noqa: N802
        head = self._room(4, 0)
        offset = len(self.Bytes) - head
        if not off <= offset:
            raise OffsetArithmeticError("flatbuffers: Offset arithmetic error.")
        head -= 4
        _U32(self.Bytes, head, offset - off + 4)
        self.head = head

    def PrependUOffsetTRelativeSlot(self, o, x, d):  # noqa: N802
        if x != d or self.forceDefaults:
            self.PrependUOffsetTRelative(x)
            if not self.nested:
                raise IsNotNestedError()
            self.current_vtable[o] = len(self.Bytes) - self.head

    def StartVector(self, elemSize, numElems, alignment):  # noqa: N802,N803
        if self.nested:
            raise IsNestedError()
        self.nested = True
        self.vectorNumElems = numElems
        self._room(4, elemSize * numElems)
        self._room(alignment, elemSize * numElems)
        return len(self.Bytes) - self.head

    def EndVector(self, numElems=None):  # noqa: N802,N803
        if numElems is not None:
            return super().EndVector(numElems)
        if not self.nested:
            raise IsNotNestedError()
        self.nested = False
        head = self.head - 4
        _U32(self.Bytes, head, self.vectorNumElems)
        self.head = head
        self.vectorNumElems = None
        return len(self.Bytes) - head

    def EndObject(self):  # noqa: N802
        if not self.nested:
            raise IsNotNestedError()
        self.nested = False
        return self._end_object(self.current_vtable, self.objectEnd)

    def table(self, numfields: int, slots: list) -> int:
        """A whole table in one call: StartObject(numfields), then each of ``slots`` prepended in order,
        (slot, flags, value) a scalar of that number type or (slot, None, offset) an offset, then
        EndObject; the caller leaves out a scalar equal to its default, as PrependSlot does."""
        if self.nested:
            raise IsNestedError()
        # room for every slot at its widest with its padding, then the object's vtable offset
        head = self._grown(16 * len(slots) + 8)
        buf = self.Bytes
        end = len(buf)
        object_end = end - head
        vtable = [0] * numfields
        widest = self.minalign
        for slot, flags, value in slots:
            width = 4 if flags is None else flags.bytewidth
            pad = (head - end) & (width - 1)
            if pad:
                buf[head - pad:head] = bytes(pad)
                head -= pad
            if flags is None:
                offset = end - head
                if not value <= offset:
                    self.head = head
                    raise OffsetArithmeticError("flatbuffers: Offset arithmetic error.")
                _U32(buf, head - 4, offset - value + 4)
            else:
                try:
                    flags.packer_type.pack_into(buf, head - width, value)
                except struct.error:
                    self.head = head
                    N.enforce_number(value, flags)
                    raise
            head -= width
            if width > widest:
                widest = width
            vtable[slot] = end - head
        self.head = head
        self.minalign = widest
        return self._end_object(vtable, object_end)

    def offsets(self, offsets: list) -> int:
        """A vector of offsets in one call: StartVector(4, n, 4), each of ``offsets`` prepended from the
        last, EndVector."""
        if self.nested:
            raise IsNestedError()
        n = len(offsets)
        head = self._room(4, 4 * n)
        buf = self.Bytes
        end = len(buf)
        for off in reversed(offsets):
            offset = end - head
            if not off <= offset:
                self.head = head
                raise OffsetArithmeticError("flatbuffers: Offset arithmetic error.")
            head -= 4
            _U32(buf, head, offset - off + 4)
        head -= 4
        _U32(buf, head, n)
        self.head = head
        self.vectorNumElems = None
        return end - head

    def _end_object(self, vtable: list, object_end: int) -> int:
        """WriteVtable: the object's offset to its vtable, the vtable written unless an equal one was."""
        head = self._room(4, 0) - 4
        self.head = head
        buf = self.Bytes
        object_offset = len(buf) - head
        last = len(vtable) - 1
        while last >= 0 and vtable[last] == 0:
            last -= 1
        fields = [object_offset - v if v else 0 for v in vtable[:last + 1]]
        object_size = object_offset - object_end
        key = (*reversed(fields), object_size)
        found = self.vtables.get(key)
        if found is None:
            entries = [len(fields) * 2 + 4, object_size, *fields]
            n = 2 * len(entries)
            head = self._room(2, n) - n
            buf = self.Bytes
            struct.pack_into(f"<{len(entries)}H", buf, head, *entries)
            self.head = head
            found = len(buf) - head
            self.vtables[key] = found
        buf = self.Bytes
        _I32(buf, len(buf) - object_offset, found - object_offset)
        self.current_vtable = None
        return object_offset
