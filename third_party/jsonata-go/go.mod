module github.com/blues/jsonata-go

go 1.16
