//! The compound methods of a `Serializer` that refuses every compound value (a key writer, the
//! none probe): the same seven stubs, written once.

/// Expands to `serialize_seq`, `serialize_tuple`, `serialize_tuple_struct`,
/// `serialize_tuple_variant`, `serialize_map`, `serialize_struct` and `serialize_struct_variant`,
/// each answering `$refuse` (an expression of type `Result<_, $error>`) before any element.
macro_rules! refuse_compounds {
    ($error:ty, $refuse:expr) => {
        fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, $error> {
            $refuse
        }
        fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, $error> {
            $refuse
        }
        fn serialize_tuple_struct(
            self,
            _name: &'static str,
            _len: usize,
        ) -> Result<Self::SerializeTupleStruct, $error> {
            $refuse
        }
        fn serialize_tuple_variant(
            self,
            _name: &'static str,
            _index: u32,
            _variant: &'static str,
            _len: usize,
        ) -> Result<Self::SerializeTupleVariant, $error> {
            $refuse
        }
        fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, $error> {
            $refuse
        }
        fn serialize_struct(
            self,
            _name: &'static str,
            _len: usize,
        ) -> Result<Self::SerializeStruct, $error> {
            $refuse
        }
        fn serialize_struct_variant(
            self,
            _name: &'static str,
            _index: u32,
            _variant: &'static str,
            _len: usize,
        ) -> Result<Self::SerializeStructVariant, $error> {
            $refuse
        }
    };
}

pub(crate) use refuse_compounds;
